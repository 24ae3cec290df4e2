"""The origin slots become the seeders: a node waiting for an origin slot takes the model from a peer instead.

:func:`peer_aware_slots` wraps the fleet's origin-slot hold (:mod:`model_agent.agent.origin_slots`). A fetch
of a source that some peer already holds Ready does not take an origin slot at all (its files come from
peers; the few the peers cannot give, e.g. small files the origin lists without a sha256, come from the
origin without a slot, as a slot-less agent would). A fetch that has to wait for a slot looks at the directory
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

Contract: the wrapped hold is entered at most once and always left when entered (its release runs; after a
successful fetch from a background task this module tracks, which the agent's shutdown cancels, releasing the
slot); an acquisition abandoned because a peer appeared is cancelled and, if it won the slot in that instant,
the slot is released at once. A block that raises releases the slot at once. Cancellation of the caller is
never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import structlog

from model_agent.peers.directory import PeerDirectory

# The owner of a fetch (a ``model_agent.sources.egress.Owner``), passed through untouched: this package sits
# below ``sources`` and only hands it to the rule and the hold it was given.
Owner = Any

log = structlog.get_logger(__name__)


class Hold(Protocol):
    """An origin-slot hold: ``hold(source, on_wait, owner=...)`` is an async context manager holding a slot."""

    def __call__(
        self, source: str, on_wait: Callable[[], None], *, owner: Owner | None = None
    ) -> AbstractAsyncContextManager[Any]: ...


LINGER_S = 60.0  # at most this long after the fetch is recorded (the Ready label normally follows within a second)
SEEN_POLL_S = 0.5


def peer_aware_slots(
    hold: Hold,
    directory: PeerDirectory,
    *,
    poll_s: float = 2.0,
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

    async def slot_or_peer(slot: AbstractAsyncContextManager[Any], source: str) -> tuple[bool, Any]:
        """Enter ``slot`` unless a peer appears first: ``(True, its value)`` when holding it, else ``(False, None)``."""
        entering = asyncio.ensure_future(slot.__aenter__())
        try:
            while True:
                done, _ = await asyncio.wait([entering], timeout=poll_s)
                if done:
                    name = entering.result()
                    break
                if await directory.holders(source):
                    await _abandon(entering, slot)
                    return False, None
        except BaseException:
            await _abandon(entering, slot)
            raise
        # Won a slot: a holder may have become visible since the last (cached) look; then the slot goes back.
        try:
            holders = await directory.holders(source, fresh=True)
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
    async def peer_or_slot(
        source: str, on_wait: Callable[[], None], *, owner: Owner | None = None
    ) -> AsyncIterator[Any]:
        if not takes_from_peers(source, owner):  # every byte from the origin: the queue as without peers
            async with hold(source, on_wait, owner=owner) as name:
                yield name
            return
        if await directory.holders(source):
            yield ""
            return
        slot = hold(source, on_wait, owner=owner)
        holding, name = await slot_or_peer(slot, source)
        if not holding:
            yield ""
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


async def _abandon(entering: asyncio.Future[Any], slot: AbstractAsyncContextManager[Any]) -> None:
    """Stop acquiring; a slot won meanwhile is released at once."""
    if not entering.done():
        entering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(asyncio.wait([entering]))
    if entering.done() and not entering.cancelled() and entering.exception() is None:
        await slot.__aexit__(None, None, None)
