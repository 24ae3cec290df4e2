"""Peer-first fetching: verified against the origin's digest, liars banned, the origin as the fallback;
the origin-slot hold skipped or abandoned once a peer holds the source."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from model_agent.local.manifest import FileRecord, Manifest
from model_agent.peers.auth import TokenReviewer
from model_agent.peers.bans import Bans
from model_agent.peers.fetch import PeerFetcher
from model_agent.peers.seeding import Hold, peer_aware_slots
from model_agent.peers.server import BlobIndex, PeerServer
from model_agent.sources import egress
from model_agent.sources.egress import CLUSTER_KIND, NAMESPACED_KIND, Owner
from model_agent.transfer import RangedConfig, part_map_path
from tests.support.waiting import until
from tests.unit.test_peers_server import AGENT, FakeApi


class FakeDirectory:
    """Holders from a list; ``stale`` answers the cached look with no holders (an answer older than a label)."""

    def __init__(self, holders: list[str], *, ready_here: bool = True, stale: bool = False) -> None:
        self.list = holders
        self.asked = 0
        self.here = ready_here
        self.stale = stale

    async def holders(self, _uri: str, *, fresh: bool = False) -> list[str]:
        self.asked += 1
        return [] if self.stale and not fresh else list(self.list)

    async def ready_here(self, _uri: str) -> bool:
        return self.here


@contextlib.asynccontextmanager
async def peer(tmp_path: Path, content: bytes, *, flip: bool = False) -> AsyncIterator[str]:
    """A real peer server holding ``content``; with ``flip``, a proxy in front that flips one byte."""
    dest = tmp_path / f"models-{os.urandom(4).hex()}" / "m"
    dest.mkdir(parents=True)
    (dest / "w.bin").write_bytes(content)
    rec = FileRecord(
        "w.bin", len(content), hashlib.sha256(content).hexdigest(), None, (dest / "w.bin").stat().st_mtime_ns
    )
    manifest = Manifest(key="k", uid="u", storage_uri="hf://o/m", dest=str(dest), files=[rec])
    server = PeerServer(
        BlobIndex(lambda: [manifest], lambda: [dest.parent]),
        TokenReviewer(FakeApi(), "model-agent-peer", AGENT),  # type: ignore[arg-type]
        host="127.0.0.1",
        port=0,
    )
    await server.start()
    runner = None
    try:
        if not flip:
            yield f"127.0.0.1:{server.port}"
            return

        async def flipping(req: web.Request) -> web.Response:
            import aiohttp

            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{server.port}{req.path}", headers=dict(req.headers)) as r,
            ):
                body = bytearray(await r.read())
                if body:
                    body[len(body) // 2] ^= 0xFF
                keep = {k: v for k, v in r.headers.items() if k in ("Content-Range", "Accept-Ranges", "ETag")}
                return web.Response(status=r.status, body=bytes(body), headers=keep)

        app = web.Application()
        app.router.add_get("/{tail:.*}", flipping)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"127.0.0.1:{port}"
    finally:
        if runner is not None:
            await runner.cleanup()
        await server.stop()


def _fetcher(directory: FakeDirectory, token: str = "good") -> tuple[PeerFetcher, Bans, list[int]]:
    bans = Bans(60)
    got: list[int] = []
    fetcher = PeerFetcher(
        directory,  # type: ignore[arg-type]
        bans,
        lambda: token,
        ranged=RangedConfig(part_size=256 * 1024, durable=False),
        on_peer_bytes=got.append,
    )
    return fetcher, bans, got


async def _fetch(fetcher: PeerFetcher, staging: Path, content: bytes, digest: str | None = None) -> Any:
    staging.mkdir(parents=True, exist_ok=True)
    progress: list[int] = []
    async with fetcher.session() as engine:
        got = await fetcher.fetch(
            engine,
            "hf://o/m",
            digest or hashlib.sha256(content).hexdigest(),
            len(content),
            staging / "w.bin",
            state_path=part_map_path(staging, "w.bin"),
            label="o/m/w.bin",
            on_bytes=progress.append,
        )
    return got, sum(progress)


async def test_a_file_comes_from_a_peer_verified(tmp_path: Path) -> None:
    content = os.urandom(1024 * 1024 + 3)
    async with peer(tmp_path, content) as address:
        fetcher, bans, peer_bytes = _fetcher(FakeDirectory([address]))
        got, progressed = await _fetch(fetcher, tmp_path / "staging", content)
    assert got is not None and (tmp_path / "staging" / "w.bin").read_bytes() == content
    assert peer_bytes == [len(content)] and progressed == len(content) and bans.total == 0


async def test_a_lying_peer_is_banned_and_the_next_one_serves(tmp_path: Path) -> None:
    content = os.urandom(1024 * 1024)
    async with peer(tmp_path, content, flip=True) as liar, peer(tmp_path, content) as honest:
        directory = FakeDirectory([liar, honest])
        fetcher, bans, _ = _fetcher(directory)
        fetcher._turn = iter([0, 0, 0])  # type: ignore[assignment] # the liar first, for this test
        got, progressed = await _fetch(fetcher, tmp_path / "staging", content)
        assert got is not None and (tmp_path / "staging" / "w.bin").read_bytes() == content
        assert bans.banned(liar) and not bans.banned(honest) and bans.total == 1
        assert progressed == len(content)  # the liar's bytes were taken back from the progress
        # the banned peer is not asked again
        assert await fetcher.candidates("hf://o/m") == [honest]


async def test_no_peer_no_token_or_all_failing_gives_none_and_leaves_nothing(tmp_path: Path) -> None:
    content = os.urandom(64 * 1024)
    staging = tmp_path / "staging"
    fetcher, _, _ = _fetcher(FakeDirectory([]))
    assert (await _fetch(fetcher, staging, content))[0] is None
    async with peer(tmp_path, content) as address:
        fetcher, _, _ = _fetcher(FakeDirectory([address]), token="")
        assert (await _fetch(fetcher, staging, content))[0] is None  # no token: peers not asked
        fetcher, bans, _ = _fetcher(FakeDirectory([address]), token="noaud")
        assert (await _fetch(fetcher, staging, content))[0] is None  # refused (403): not a ban
        assert bans.total == 0
        fetcher, bans, _ = _fetcher(FakeDirectory([address]))
        got, _ = await _fetch(fetcher, staging, content, digest="0" * 64)  # the peer holds no such digest
        assert got is None
    assert not (staging / "w.bin").exists() and not part_map_path(staging, "w.bin").exists()


async def test_files_are_spread_over_peers() -> None:
    fetcher, _, _ = _fetcher(FakeDirectory(["a:1", "b:1", "c:1"]))
    firsts = [(await fetcher.candidates("u"))[0] for _ in range(6)]
    assert sorted(set(firsts)) == ["a:1", "b:1", "c:1"]


class FakeSlots:
    """An origin-slot hold that is granted when ``free`` is set."""

    def __init__(self) -> None:
        self.free = asyncio.Event()
        self.entered = 0
        self.exited = 0

    def hold(self, _source: str, on_wait: Callable[[], None], **_kw: Any) -> Any:
        slots = self

        @contextlib.asynccontextmanager
        async def cm() -> AsyncIterator[str]:
            on_wait()
            await slots.free.wait()
            slots.entered += 1
            try:
                yield "origin-0"
            finally:
                slots.exited += 1

        return cm()


def peer_aware(hold: Any, directory: Any) -> Hold:
    """The peer-aware hold under test, with the product's peer rule and a fast poll."""
    return peer_aware_slots(hold, directory, takes_from_peers=egress.takes_from_peers, poll_s=0.01)


async def test_no_slot_is_taken_when_a_peer_already_holds_the_source() -> None:
    slots = FakeSlots()
    hold = peer_aware(slots.hold, FakeDirectory(["a:1"]))
    async with hold("hf://o/m", lambda: None) as name:
        assert name == ""
    assert slots.entered == 0


async def test_waiting_for_a_slot_stops_when_a_peer_becomes_ready() -> None:
    slots = FakeSlots()
    directory = FakeDirectory([])
    hold = peer_aware(slots.hold, directory)

    async def later() -> None:
        while directory.asked < 3:
            await asyncio.sleep(0.01)
        directory.list = ["a:1"]

    helper = asyncio.create_task(later())
    async with hold("hf://o/m", lambda: None) as name:
        assert name == ""
    await helper
    assert slots.entered == 0 and slots.exited == 0


async def test_a_free_slot_is_held_and_released() -> None:
    slots = FakeSlots()
    slots.free.set()
    hold = peer_aware(slots.hold, FakeDirectory([]))
    async with hold("hf://o/m", lambda: None) as name:
        assert name == "origin-0" and slots.exited == 0
    await until(lambda: slots.exited == 1, "the slot released once this node is seen Ready")
    assert slots.entered == 1


TENANT = Owner(NAMESPACED_KIND, "team-a")  # a BaseModel outside --trusted-namespace (none is trusted here)


@pytest.mark.parametrize(
    ("source", "owner"),
    [("hf://o/m", TENANT), ("s3://bucket/m", None)],  # a tenant; a source that never asks peers
)
async def test_a_fetch_that_takes_nothing_from_peers_queues_for_its_slot_even_when_a_peer_holds_it(
    source: str, owner: Owner | None
) -> None:
    slots = FakeSlots()
    directory = FakeDirectory(["a:1"])
    hold = peer_aware(slots.hold, directory)
    queued, names = asyncio.Event(), []

    async def fetch() -> None:
        async with hold(source, queued.set, owner=owner) as name:
            names.append(name)

    task = asyncio.create_task(fetch())
    async with asyncio.timeout(5):
        await queued.wait()
    assert names == [] and slots.entered == 0  # waiting in the queue, not skipping it for the peer
    slots.free.set()
    async with asyncio.timeout(5):
        await task
    assert names == ["origin-0"] and (slots.entered, slots.exited) == (1, 1)  # released at once: no peer to wait for
    assert directory.asked == 0  # peers were not even looked at


async def test_a_trusted_fetch_of_the_same_source_skips_the_queue() -> None:
    slots = FakeSlots()
    hold = peer_aware(slots.hold, FakeDirectory(["a:1"]))
    async with hold("hf://o/m", lambda: None, owner=Owner(CLUSTER_KIND)) as name:
        assert name == ""
    assert slots.entered == 0
