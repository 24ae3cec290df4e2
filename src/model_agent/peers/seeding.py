"""The origin slots become the seeders: a node waiting for an origin slot takes the model from a peer instead.

:func:`peer_aware_slots` wraps the fleet's origin-slot hold (:mod:`model_agent.agent.origin_slots`). A fetch
of a source that some peer already holds Ready does not take an origin slot at all (its files come from
peers; the few the peers cannot give, e.g. files the origin lists without a digest, come from the origin
without a slot, as a slot-less agent would). A fetch that has to wait for a slot looks at the directory
every ``poll_s`` meanwhile and stops waiting as soon as a holder appears. So with one slot the origin serves a
model's bytes about once: to the first node, which then seeds the others. Only a fetch that takes bytes from peers
does either (the ``takes_from_peers`` rule it is handed, :func:`model_agent.sources.egress.takes_from_peers`: a
trusted owner, an ``hf://`` source): a tenant's fetch, or one of a source that never asks peers, goes to the origin
for every byte, so it queues for its slot exactly as without peers, whoever holds the source.

The hand-over has no gap. The slot holder keeps its slot after its fetch is recorded until the cluster sees
this node Ready for the source (:meth:`~model_agent.peers.directory.PeerDirectory.ready_here`: its Node label,
which is what other nodes' directories read), at most ``linger_s``; and a node that wins a slot looks at the
directory once more, uncached, and gives the slot back at once when a holder is there. Without the first, a
waiting node could take the freed slot in the moment between publish and the Ready label and fetch the model
from the origin a second time; without the second, it could act on a directory answer older than the label.

Nodes still fetching the source count as well (:meth:`~model_agent.peers.directory.PeerDirectory.relaying`: Nodes
labelled ``Updating`` for it, which serve the durable parts of what they fetch, :mod:`.relay`): a fetch that sees
one skips the queue too, so the fleet fetches in chains from the seed instead of one node after the other. Such a
fetch never goes to the origin without a slot: it runs with an :class:`OriginGate` (in :data:`ORIGIN_GATE`, which
:mod:`.fetch` reads), and when no peer can give a file it waits for the origin slot through the gate, still asking
peers meanwhile (when no node holds the source Ready yet, the gate asks for the slot from the start: one of the
fetching nodes has to go to the origin, and the winner then asks only Ready copies before it does); a slot won
that way is kept like a seeder's (until this node is seen Ready) and released at once
when the fetch fails.

Contract: the wrapped hold is entered at most once and always left when entered (its release runs; after a
successful fetch from a background task this module tracks, which the agent's shutdown cancels, releasing the
slot); an acquisition abandoned because a peer appeared is cancelled and, if it won the slot in that instant,
the slot is released at once. A block that raises releases the slot at once. Cancellation of the caller is
never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import structlog

from model_agent.peers.directory import PeerDirectory
from model_agent.transfer.aio import abandon_entry, enter_unless

# The owner of a fetch (a ``model_agent.sources.egress.Owner``), passed through untouched: this package sits
# below ``sources`` and only hands it to the rule and the hold it was given.
Owner = Any

log = structlog.get_logger(__name__)


class Hold(Protocol):
    """An origin-slot hold: ``hold(source, on_wait, owner=...)`` is an async context manager holding a slot."""

    def __call__(
        self, source: str, on_wait: Callable[[], None], *, owner: Owner | None = None
    ) -> AbstractAsyncContextManager[Any]: ...


class OriginGate:
    """The origin slot of a fetch that skipped the queue for peers, taken only if peers cannot give a file.

    :meth:`wait` starts acquiring the slot (once; the files of the fetch share it) and waits for it at most
    ``timeout`` seconds (:meth:`start` starts it without waiting, for a fetch that no Ready holder can serve);
    :meth:`abandon` stops an acquisition not yet won when no file waits for it (a peer gave the file after all);
    :attr:`holding` (:meth:`won`) says whether the slot is this fetch's, so it may go to the origin.
    """

    def __init__(self, hold: Hold, source: str, on_wait: Callable[[], None], owner: Owner | None) -> None:
        self._hold = hold
        self._source, self._on_wait, self._owner = source, on_wait, owner
        self._slot: AbstractAsyncContextManager[Any] | None = None
        self._entering: asyncio.Future[Any] | None = None
        self._waiting = 0
        self.holding = False

    def start(self) -> None:
        """Start acquiring the slot without waiting for it (a no-op when held or being acquired)."""
        if self._entering is None and not self.holding:
            self._slot = self._hold(self._source, self._on_wait, owner=self._owner)  # (a hold is entered once)
            self._entering = asyncio.ensure_future(self._slot.__aenter__())

    def won(self) -> bool:
        """Whether the slot is this fetch's, noting an acquisition that completed meanwhile (never waits)."""
        entering = self._entering
        if entering is not None and entering.done() and not entering.cancelled() and entering.exception() is None:
            self._entering = None  # (set only while not holding)
            self.holding = True
        return self.holding

    async def wait(self, timeout: float) -> bool:
        """Acquire the slot, waiting at most ``timeout`` s; whether it is held now."""
        if self.holding:
            return True
        self.start()
        entering = self._entering
        assert entering is not None
        self._waiting += 1
        try:
            done, _ = await asyncio.wait([entering], timeout=timeout)
        finally:
            self._waiting -= 1
        if self.holding or entering is not self._entering:
            return self.holding  # (another file saw it won, or it was abandoned meanwhile)
        if done:
            self._entering = None
            entering.result()  # an error of the hold is the fetch's
            self.holding = True
        return self.holding

    async def abandon(self, *, force: bool = False) -> None:
        """Stop an acquisition that has not been won and no file waits for (any, with ``force``); a slot won in
        that instant is released at once."""
        if self._entering is not None and not self.holding and (force or not self._waiting):
            entering, self._entering = self._entering, None
            assert self._slot is not None
            await abandon_entry(entering, self._slot)

    async def leave(self, exc: BaseException | None) -> AbstractAsyncContextManager[Any] | None:
        """The fetch ended: stop acquiring; the slot, if held, is released (failure) or handed back to keep."""
        await self.abandon(force=True)
        if not self.holding or self._slot is None:
            return None
        self.holding = False
        if exc is not None:
            await self._slot.__aexit__(type(exc), exc, exc.__traceback__)
            return None
        return self._slot


# The gate of the fetch running in this context (set by peer_aware_slots while it skips the queue for peers).
ORIGIN_GATE: contextvars.ContextVar[OriginGate | None] = contextvars.ContextVar("origin_gate", default=None)

LINGER_S = 60.0  # at most this long after the fetch is recorded (the Ready label normally follows within a second)
SEEN_POLL_S = 0.5


def peer_aware_slots(
    hold: Hold,
    directory: PeerDirectory,
    *,
    poll_s: float = 0.5,
    linger_s: float = LINGER_S,
    seen_poll_s: float = SEEN_POLL_S,
    takes_from_peers: Callable[[str, Owner | None], bool],
    keepers: set[asyncio.Task[None]] | None = None,
) -> Hold:
    """``hold`` that skips (or stops waiting for) the origin slot once a peer holds the source.

    ``takes_from_peers(source, owner)`` says whether a fetch may take bytes from peers at all; one that may not
    queues for its slot as without peers. ``keepers`` collects the tasks that keep a slot until this node is
    seen Ready (see the module docstring).
    """
    kept = keepers if keepers is not None else set()

    async def peers_there(source: str, *, fresh: bool = False) -> bool:
        """Whether a node holds the source Ready or is fetching it (and so relays it)."""
        return bool(await directory.holders(source, fresh=fresh) or await directory.relaying(source, fresh=fresh))

    async def slot_or_peer(slot: AbstractAsyncContextManager[Any], source: str) -> tuple[bool, Any]:
        """Enter ``slot`` unless a peer appears first: ``(True, its value)`` when holding it, else ``(False, None)``."""
        holding, name = await enter_unless(slot, lambda: peers_there(source), poll_s)
        if not holding:
            return False, None
        # Won a slot: a holder may have become visible since the last (cached) look; then the slot goes back.
        try:
            holders = await peers_there(source, fresh=True)
        except BaseException:
            await slot.__aexit__(None, None, None)
            raise
        if holders:
            await slot.__aexit__(None, None, None)
            return False, None
        return True, name

    def keep_until_seen(slot: AbstractAsyncContextManager[Any], source: str) -> None:
        task = asyncio.get_running_loop().create_task(
            _keep_until_seen(slot, directory, source, linger_s, seen_poll_s), name=f"origin slot of {source}"
        )
        kept.add(task)
        task.add_done_callback(kept.discard)

    @contextlib.asynccontextmanager
    async def through_peers(source: str, owner: Owner | None, *, anyone_ready: bool) -> AsyncIterator[Any]:
        """The fetch goes to peers, with a gate to the origin slot for what they cannot give."""
        gate = OriginGate(hold, source, lambda: None, owner)  # (not "queued": the fetch goes on meanwhile)
        if not anyone_ready:
            # Nobody holds the source Ready: one of the nodes fetching it must go to the origin, and whoever wins
            # the slot is that node. Asking now, while the revision resolves, instead of after a first round of
            # peers that cannot give anything yet, starts the fleet's only origin fetch that much sooner; the
            # acquisition is abandoned as usual once a peer gives a file and no file waits for it.
            gate.start()
        log.info("origin-slot queue skipped: peers hold or are fetching the source", source=source)
        token = ORIGIN_GATE.set(gate)
        try:
            yield ""
        except BaseException as exc:
            await gate.leave(exc)
            raise
        else:
            slot = await gate.leave(None)
            if slot is not None:
                keep_until_seen(slot, source)  # it fetched from the origin: a seeder, kept until seen Ready
        finally:
            with contextlib.suppress(ValueError):  # (left in another context: nothing to restore there)
                ORIGIN_GATE.reset(token)

    @contextlib.asynccontextmanager
    async def peer_or_slot(
        source: str, on_wait: Callable[[], None], *, owner: Owner | None = None
    ) -> AsyncIterator[Any]:
        if not takes_from_peers(source, owner):  # every byte from the origin: the queue as without peers
            async with hold(source, on_wait, owner=owner) as name:
                yield name
            return
        ready = await directory.holders(source)
        if ready or await directory.relaying(source):
            async with through_peers(source, owner, anyone_ready=bool(ready)) as name:
                yield name
            return
        slot = hold(source, on_wait, owner=owner)
        holding, name = await slot_or_peer(slot, source)
        if not holding:  # a peer turned up while waiting (the look that found it is cached: no new request)
            async with through_peers(source, owner, anyone_ready=bool(await directory.holders(source))) as name:
                yield name
            return
        try:
            yield name
        except BaseException as exc:
            await slot.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        keep_until_seen(slot, source)  # the fetch is recorded: the slot goes once peers can see this node Ready

    return peer_or_slot


async def _keep_until_seen(
    slot: AbstractAsyncContextManager[Any], directory: PeerDirectory, source: str, linger_s: float, poll_s: float
) -> None:
    """Leave ``slot`` once this node is Ready for ``source`` in the cluster's eyes, or after ``linger_s``."""
    deadline = time.monotonic() + linger_s
    try:
        while time.monotonic() < deadline:
            if await directory.ready_here(source):
                break
            await asyncio.sleep(poll_s)
        else:
            log.info("origin slot released before this node was seen Ready", source=source, after_s=linger_s)
    finally:
        await slot.__aexit__(None, None, None)
