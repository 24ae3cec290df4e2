"""The origin slots become the seeders: a node waiting for an origin slot takes the model from a peer instead.

:func:`peer_aware_slots` wraps the fleet's origin-slot hold (:mod:`model_agent.agent.origin_slots`). A fetch
of a source that some peer already holds Ready does not take an origin slot at all (its files come from
peers; the few the peers cannot give, e.g. small files the origin lists without a sha256, come from the
origin without a slot, as a slot-less agent would). A fetch that has to wait for a slot looks at the
directory every ``poll_s`` meanwhile and stops waiting as soon as a holder appears. So with one slot the
origin serves a model's bytes about once: to the first node, which then seeds the others.

Contract: the wrapped hold is entered at most once and always left when entered (its release runs); an
acquisition abandoned because a peer appeared is cancelled and, if it won the slot in that instant, the
slot is released at once. Cancellation of the caller is never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from model_agent.peers.directory import PeerDirectory

Hold = Callable[[str, Callable[[], None]], AbstractAsyncContextManager[Any]]


def peer_aware_slots(hold: Hold, directory: PeerDirectory, *, poll_s: float = 2.0) -> Hold:
    """``hold`` that skips (or stops waiting for) the origin slot once a peer holds the source."""

    async def slot_or_peer(slot: AbstractAsyncContextManager[Any], source: str) -> tuple[bool, Any]:
        """Enter ``slot`` unless a peer appears first: ``(True, its value)`` when holding it, else ``(False, None)``."""
        entering = asyncio.ensure_future(slot.__aenter__())
        try:
            while True:
                done, _ = await asyncio.wait([entering], timeout=poll_s)
                if done:
                    return True, entering.result()
                if await directory.holders(source):
                    break
        except BaseException:
            await _abandon(entering, slot)
            raise
        await _abandon(entering, slot)
        return False, None

    @contextlib.asynccontextmanager
    async def peer_or_slot(source: str, on_wait: Callable[[], None]) -> AsyncIterator[Any]:
        if await directory.holders(source):
            yield ""
            return
        slot = hold(source, on_wait)
        holding, name = await slot_or_peer(slot, source)
        if not holding:
            yield ""
            return
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_exit(slot.__aexit__)
            yield name

    return peer_or_slot


async def _abandon(entering: asyncio.Future[Any], slot: AbstractAsyncContextManager[Any]) -> None:
    """Stop acquiring; a slot won meanwhile is released at once."""
    if not entering.done():
        entering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(asyncio.wait([entering]))
    if entering.done() and not entering.cancelled() and entering.exception() is None:
        await slot.__aexit__(None, None, None)
