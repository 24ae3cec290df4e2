"""Peers that served bytes failing verification, banned for a while.

Contract: :meth:`Bans.ban` bans an address for ``ban_s`` seconds (a second ban extends it) and counts it
(``on_ban``); :meth:`Bans.banned` says whether an address is banned now. In memory only: a restarted agent
gives every peer another chance, which costs bandwidth only (every file is verified).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Bans:
    """Addresses banned until a monotonic deadline."""

    def __init__(self, ban_s: float = 600.0, *, on_ban: Callable[[str], None] = lambda _a: None) -> None:
        self.ban_s = ban_s
        self.on_ban = on_ban
        self._until: dict[str, float] = {}
        self.total = 0

    def ban(self, address: str, now: float | None = None) -> None:
        """Ban ``address`` for ``ban_s`` from now."""
        at = time.monotonic() if now is None else now
        self._until[address] = at + self.ban_s
        self.total += 1
        self.on_ban(address)

    def banned(self, address: str, now: float | None = None) -> bool:
        """Whether ``address`` is banned at ``now``."""
        until = self._until.get(address)
        if until is None:
            return False
        if (time.monotonic() if now is None else now) >= until:
            del self._until[address]
            return False
        return True

    def current(self) -> list[str]:
        """The addresses banned now (for the status)."""
        return [a for a in list(self._until) if self.banned(a)]
