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
from model_agent.peers.fetch import PARTS_AT_ONCE, PeerFetcher
from model_agent.peers.relay import Relay, Relays, order_candidates
from model_agent.peers.seeding import ORIGIN_GATE, Hold, OriginGate, peer_aware_slots
from model_agent.peers.server import BlobIndex, PeerServer
from model_agent.sources import egress
from model_agent.sources.egress import CLUSTER_KIND, NAMESPACED_KIND, Owner
from model_agent.transfer import RangedConfig, part_map_path
from model_agent.transfer.partmap import PartMap
from tests.support.waiting import until
from tests.unit.test_peers_server import AGENT, FakeApi


class FakeDirectory:
    """Holders from a list; ``stale`` answers the cached look with no holders (an answer older than a label)."""

    def __init__(
        self, holders: list[str], *, ready_here: bool = True, stale: bool = False, fetching: list[str] | None = None
    ) -> None:
        self.list = holders
        self.fetching = fetching or []  # nodes labelled Updating for the source
        self.asked = 0
        self.here = ready_here
        self.stale = stale

    async def holders(self, _uri: str, *, fresh: bool = False) -> list[str]:
        self.asked += 1
        return [] if self.stale and not fresh else list(self.list)

    async def relaying(self, _uri: str, *, fresh: bool = False) -> list[str]:
        return [] if self.stale and not fresh else list(self.fetching)

    async def ready_here(self, _uri: str) -> bool:
        return self.here


@contextlib.asynccontextmanager
async def peer(
    tmp_path: Path, content: bytes, *, flip: bool = False, git_sha1: str | None = None
) -> AsyncIterator[str]:
    """A real peer server holding ``content`` (recorded with ``git_sha1`` too when given, as a hub's small file
    is); with ``flip``, a proxy in front that flips one byte."""
    dest = tmp_path / f"models-{os.urandom(4).hex()}" / "m"
    dest.mkdir(parents=True)
    (dest / "w.bin").write_bytes(content)
    rec = FileRecord(
        "w.bin", len(content), hashlib.sha256(content).hexdigest(), git_sha1, (dest / "w.bin").stat().st_mtime_ns
    )
    manifest = Manifest(key="k", uid="u", storage_uri="hf://o/m", dest=str(dest), files=[rec])
    server = PeerServer(
        BlobIndex(lambda: [manifest], lambda: [dest.parent], by_blob_id=lambda _m: True),  # (a trusted copy)
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
    """An origin-slot hold: ``asked`` once acquisition starts, granted when ``free`` is set."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.free = asyncio.Event()
        self.entered = 0
        self.exited = 0

    def hold(self, _source: str, on_wait: Callable[[], None], **_kw: Any) -> Any:
        slots = self

        @contextlib.asynccontextmanager
        async def cm() -> AsyncIterator[str]:
            slots.asked.set()
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
    assert slots.entered == 0 and not slots.asked.is_set()


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


# ---------------------------------------------------------------- relays: files still being fetched (peers.relay)

PART = 64 * 1024
ME = "zz-me:1"  # sorts after 127.0.0.1:*: the nearest before it in the ring is the highest of those


@contextlib.asynccontextmanager
async def relay_peer(tmp_path: Path, *, wait_s: float = 30.0) -> AsyncIterator[tuple[str, PeerServer, Relays, Path]]:
    """A real peer server with no Ready file and a relay registry; files go in the staging dir it yields."""
    root = tmp_path / f"models-{os.urandom(4).hex()}"
    staging = root / ".model-agent" / "staging" / "m"
    staging.mkdir(parents=True)
    relays = Relays()
    server = PeerServer(
        BlobIndex(lambda: [], lambda: [root], index_s=0.0),
        TokenReviewer(FakeApi(), "model-agent-peer", AGENT),  # type: ignore[arg-type]
        host="127.0.0.1",
        port=0,
        relays=relays,
        relay_poll_s=0.005,
        relay_wait_s=wait_s,
    )
    await server.start()
    try:
        yield f"127.0.0.1:{server.port}", server, relays, staging
    finally:
        await server.stop()


def _record(state_path: Path, size: int, parts: int, *, complete: bool = False) -> None:
    state = PartMap.fresh(size, PART, None)
    for i in range(parts):
        state.mark(i)
    state.complete = complete
    state.save(state_path)


def _relay_fetcher(directory: FakeDirectory, **tuning: float) -> tuple[PeerFetcher, Relays]:
    relays = Relays()
    fetcher = PeerFetcher(
        directory,  # type: ignore[arg-type]
        Bans(60),
        lambda: "good",
        ranged=RangedConfig(part_size=PART, durable=False, backoff_base_s=0.01),
        relays=relays,
        me=lambda: ME,
        **tuning,  # type: ignore[arg-type]
    )
    return fetcher, relays


async def _relayed_fetch(
    fetcher: PeerFetcher,
    relays: Relays,
    staging: Path,
    content: bytes,
    on_bytes: Callable[[int], None],
    *,
    slot_free: bool | None = False,
) -> Any:
    """The fetch of a node that skipped the origin-slot queue (a gate whose slot is granted at once when
    ``slot_free``, never when False; no gate with None), relaying the file in its own registry meanwhile."""
    if slot_free is None:
        return await _relayed(fetcher, relays, staging, content, on_bytes)
    slots = FakeSlots()
    if slot_free:
        slots.free.set()
    token = ORIGIN_GATE.set(OriginGate(slots.hold, "hf://o/m", lambda: None, None))  # type: ignore[arg-type]
    try:
        return await _relayed(fetcher, relays, staging, content, on_bytes)
    finally:
        ORIGIN_GATE.reset(token)


async def _relayed(
    fetcher: PeerFetcher, relays: Relays, staging: Path, content: bytes, on_bytes: Callable[[int], None]
) -> Any:
    staging.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(content).hexdigest()
    with relays.scope() as scope:
        relay = scope.start(digest, len(content), staging / "w.bin", part_map_path(staging, "w.bin"))
        async with fetcher.session() as engine:
            got = await fetcher.fetch(
                engine,
                "hf://o/m",
                digest,
                len(content),
                staging / "w.bin",
                state_path=part_map_path(staging, "w.bin"),
                label="o/m/w.bin",
                on_bytes=on_bytes,
                relay=relay,
            )
        return got, relay


async def test_a_file_is_taken_from_a_node_still_fetching_it_part_by_durable_part(tmp_path: Path) -> None:
    content = os.urandom(6 * PART + 123)
    digest = hashlib.sha256(content).hexdigest()
    async with relay_peer(tmp_path) as (address, server, up_relays, up_staging):
        path, state_path = up_staging / "w.bin", up_staging / "w.bin.json"
        path.write_bytes(content)  # every byte on disk; only what the map records is served
        recorded = [1]
        _record(state_path, len(content), 1)
        with up_relays.scope() as scope:
            up_relays.fed_by(scope.start(digest, len(content), path, state_path), ("10.0.0.1:1",))
            received = [0]

            def on_bytes(n: int) -> None:  # the upstream records its next part once this node has all it had
                received[0] += n
                assert received[0] <= min(len(content), recorded[0] * PART)  # never more than was durable
                if received[0] == recorded[0] * PART:
                    recorded[0] += 1
                    _record(state_path, len(content), recorded[0], complete=recorded[0] * PART >= len(content))

            fetcher, relays = _relay_fetcher(FakeDirectory([], fetching=[address]))
            async with asyncio.timeout(30):
                got, relay = await _relayed_fetch(fetcher, relays, tmp_path / "staging", content, on_bytes)
    assert got is not None and got.digests["sha256"] == digest
    assert (tmp_path / "staging" / "w.bin").read_bytes() == content
    assert relay.upstream == (address, "10.0.0.1:1")  # this node relayed it meanwhile, one hop further down
    assert server.uploaded == len(content)


async def test_a_file_is_relayed_as_its_bytes_are_written_before_any_part_is_recorded(tmp_path: Path) -> None:
    """The upstream's engine reports each write (``on_written``); a downstream gets those bytes at once, while the
    upstream's part map records nothing yet, and never a byte that was not written."""
    content = os.urandom(3 * PART + 77)
    digest = hashlib.sha256(content).hexdigest()
    async with relay_peer(tmp_path) as (address, server, up_relays, up_staging):
        path, state_path = up_staging / "w.bin", up_staging / "w.bin.json"
        path.write_bytes(content)  # every byte on disk; only what was reported written is served (no map at all)
        step = 5000
        written = [step]
        with up_relays.scope() as scope:
            relay = scope.start(digest, len(content), path, state_path)
            up_relays.fed_by(relay, ("10.0.0.1:1",))
            write = relay.writer()
            write(0, step)
            received = [0]

            def on_bytes(n: int) -> None:  # the upstream writes its next piece once this node has all it had
                received[0] += n
                assert received[0] <= written[0]  # never a byte the upstream had not written
                if received[0] == written[0] < len(content):
                    end = min(len(content), written[0] + step)
                    write(written[0], end)
                    written[0] = end

            fetcher, relays = _relay_fetcher(FakeDirectory([], fetching=[address]))
            async with asyncio.timeout(30):
                got, _ = await _relayed_fetch(fetcher, relays, tmp_path / "staging", content, on_bytes)
    assert got is not None and got.digests["sha256"] == digest
    assert (tmp_path / "staging" / "w.bin").read_bytes() == content
    assert not state_path.exists()  # (nothing was ever recorded upstream: every byte came as written)
    assert server.uploaded == len(content)


async def test_a_stalled_holder_is_left_and_the_next_one_resumes_the_file(tmp_path: Path) -> None:
    content = os.urandom(5 * PART)
    digest = hashlib.sha256(content).hexdigest()
    async with relay_peer(tmp_path, wait_s=0.2) as first, relay_peer(tmp_path, wait_s=0.2) as second:
        order = order_candidates([], [first[0], second[0]], ME, 0)
        stalled, full = (first, second) if order[0] == first[0] else (second, first)
        with stalled[2].scope() as s1, full[2].scope() as s2:
            for (_, _, relays, staging), parts in ((stalled, 1), (full, 5)):
                (staging / "w.bin").write_bytes(content)
                _record(staging / "w.bin.json", len(content), parts, complete=parts == 5)
                scope = s1 if relays is stalled[2] else s2
                relays.fed_by(scope.start(digest, len(content), staging / "w.bin", staging / "w.bin.json"), ())
            fetcher, relays = _relay_fetcher(FakeDirectory([], fetching=[first[0], second[0]]))
            fed: list[tuple[str, ...] | None] = []
            real_fed_by = relays.fed_by

            def fed_by(relay: Relay, upstream: tuple[str, ...] | None) -> None:
                fed.append(upstream)
                real_fed_by(relay, upstream)

            relays.fed_by = fed_by  # type: ignore[method-assign]
            progress: list[int] = []
            async with asyncio.timeout(60):
                got, relay = await _relayed_fetch(fetcher, relays, tmp_path / "staging", content, progress.append)
    assert got is not None and got.digests["sha256"] == digest and sum(progress) == len(content)
    assert got.resumed_bytes == PART  # what the stalled holder gave stayed
    assert stalled[1].uploaded == PART and full[1].uploaded == len(content) - PART
    assert relay.upstream == (full[0],)
    # between the two holders this node stayed servable (its own downstream waits instead of leaving it too)
    assert fed == [(stalled[0],), (full[0],)]


async def test_a_holder_whose_chain_contains_this_node_is_not_used(tmp_path: Path) -> None:
    content = os.urandom(2 * PART)
    digest = hashlib.sha256(content).hexdigest()
    async with relay_peer(tmp_path) as (address, server, up_relays, up_staging):
        (up_staging / "w.bin").write_bytes(content)
        _record(up_staging / "w.bin.json", len(content), 2, complete=True)
        with up_relays.scope() as scope:
            entry = scope.start(digest, len(content), up_staging / "w.bin", up_staging / "w.bin.json")
            up_relays.fed_by(entry, ("10.0.0.5:1", ME))  # it gets the file through this node: a cycle
            fetcher, relays = _relay_fetcher(FakeDirectory([], fetching=[address]))
            got, _ = await _relayed_fetch(
                fetcher, relays, tmp_path / "staging", content, lambda _n: None, slot_free=True
            )
    assert got is None and server.uploaded == 0


async def test_a_fetch_that_skipped_the_queue_goes_to_the_origin_only_holding_the_slot(tmp_path: Path) -> None:
    content = os.urandom(2 * PART)
    slots = FakeSlots()
    gate = OriginGate(slots.hold, "hf://o/m", lambda: None, None)  # type: ignore[arg-type]
    directory = FakeDirectory([], fetching=["127.0.0.1:9"])  # listed as fetching, serves nothing
    fetcher, relays = _relay_fetcher(directory)
    token = ORIGIN_GATE.set(gate)
    try:
        task = asyncio.create_task(_relayed(fetcher, relays, tmp_path / "staging", content, lambda _n: None))
        async with asyncio.timeout(10):
            await slots.asked.wait()  # no peer could give it: waiting for the slot, not at the origin
        assert not task.done()
        slots.free.set()
        async with asyncio.timeout(10):
            got, _ = await task
    finally:
        ORIGIN_GATE.reset(token)
    assert got is None and gate.holding and slots.entered == 1  # now it may go to the origin


async def _through_gate(gate: OriginGate, directory: FakeDirectory, tmp_path: Path, content: bytes) -> Any:
    """A relayed fetch of ``content`` with ``gate`` as its origin gate; what the peers gave (None: the origin's)."""
    fetcher, relays = _relay_fetcher(directory)
    token = ORIGIN_GATE.set(gate)
    try:
        async with asyncio.timeout(10):
            got, _ = await _relayed(fetcher, relays, tmp_path / "staging", content, lambda _n: None)
    finally:
        ORIGIN_GATE.reset(token)
    return got


async def test_a_file_goes_to_the_origin_as_soon_as_the_slot_is_won_without_asking_peers_again(tmp_path: Path) -> None:
    content = os.urandom(2 * PART)
    slots = FakeSlots()
    slots.free.set()  # the slot is there for the asking
    gate = OriginGate(slots.hold, "hf://o/m", lambda: None, None)  # type: ignore[arg-type]
    directory = FakeDirectory([], fetching=["127.0.0.1:9"])  # listed as fetching, serves nothing
    got = await _through_gate(gate, directory, tmp_path, content)
    # One round of peers, then the slot: a second round (what the fetch did before) would have looked again.
    assert got is None and gate.holding and directory.asked == 1


async def test_a_fetch_whose_slot_was_won_before_its_files_asks_only_ready_copies(tmp_path: Path) -> None:
    content = os.urandom(2 * PART)
    slots = FakeSlots()
    slots.free.set()
    gate = OriginGate(slots.hold, "hf://o/m", lambda: None, None)  # type: ignore[arg-type]
    gate.start()  # (what a fetch does when nobody holds the source Ready)
    await until(gate.won, "the slot won before any file asks")
    async with peer(tmp_path, content) as address:
        directory = FakeDirectory([], fetching=[address])  # a node still fetching it, which could serve it
        got = await _through_gate(gate, directory, tmp_path, content)
    # Holding the slot, the file goes to the origin at once, as a fetch that queued for its slot would.
    assert got is None and gate.holding and slots.entered == 1 and directory.asked == 1


async def test_a_peer_that_appears_while_waiting_for_the_slot_gives_the_file(tmp_path: Path) -> None:
    content = os.urandom(2 * PART)
    slots = FakeSlots()
    gate = OriginGate(slots.hold, "hf://o/m", lambda: None, None)  # type: ignore[arg-type]
    directory = FakeDirectory([])
    fetcher, relays = _relay_fetcher(directory)
    async with peer(tmp_path, content) as address:
        token = ORIGIN_GATE.set(gate)
        try:
            task = asyncio.create_task(_relayed(fetcher, relays, tmp_path / "staging", content, lambda _n: None))
            async with asyncio.timeout(10):
                await slots.asked.wait()
            directory.list = [address]  # a node became Ready meanwhile
            async with asyncio.timeout(10):
                got, _ = await task
        finally:
            ORIGIN_GATE.reset(token)
    assert got is not None and not gate.holding and slots.entered == 0  # the acquisition was abandoned


async def test_skipping_the_queue_for_a_node_still_fetching_sets_a_gate_kept_like_a_seeders_slot() -> None:
    slots = FakeSlots()
    slots.free.set()
    directory = FakeDirectory([], fetching=["a:1"], ready_here=False)
    hold = peer_aware(slots.hold, directory)
    async with hold("hf://o/m", lambda: None) as name:
        gate = ORIGIN_GATE.get()
        assert name == "" and gate is not None and not gate.holding
        # Nobody holds it Ready: the slot is asked for at once, before any file has asked peers.
        async with asyncio.timeout(5):
            await slots.asked.wait()
        assert await gate.wait(5)  # no peer could give a file: the slot, through the gate
    assert ORIGIN_GATE.get() is None
    assert slots.exited == 0  # kept: this node fetched from the origin, a seeder until seen Ready
    directory.here = True
    await until(lambda: slots.exited == 1, "the slot released once this node is seen Ready")


async def test_a_gate_slot_is_released_at_once_when_the_fetch_fails() -> None:
    slots = FakeSlots()
    slots.free.set()
    hold = peer_aware(slots.hold, FakeDirectory([], fetching=["a:1"], ready_here=False))
    with pytest.raises(RuntimeError):
        async with hold("hf://o/m", lambda: None):
            gate = ORIGIN_GATE.get()
            assert gate is not None and await gate.wait(5)
            raise RuntimeError("the fetch failed")
    assert (slots.entered, slots.exited) == (1, 1)


async def test_the_files_of_one_fetch_share_its_gate_and_a_peer_giving_one_does_not_lose_the_others_slot() -> None:
    slots = FakeSlots()
    gate = OriginGate(slots.hold, "hf://o/m", lambda: None, None)  # type: ignore[arg-type]
    assert not await gate.wait(0.01)
    await gate.abandon()  # one file came from a peer; no other waits: the acquisition stops
    waiting = [asyncio.create_task(gate.wait(10)) for _ in range(3)]  # three files need the origin: a new one
    await until(lambda: gate._waiting == 3, "three files waiting")
    await gate.abandon()  # a fourth file came from a peer: the others still wait
    slots.free.set()
    assert await asyncio.gather(*waiting) == [True, True, True] and slots.entered == 1
    assert await gate.leave(RuntimeError("failed")) is None and slots.exited == 1


async def test_a_busy_holder_keeps_the_fetch_off_the_origin_even_with_the_slot_free(tmp_path: Path) -> None:
    content = os.urandom(2 * PART)
    digest = hashlib.sha256(content).hexdigest()
    async with relay_peer(tmp_path) as (address, server, up_relays, up_staging):
        (up_staging / "w.bin").write_bytes(content)
        _record(up_staging / "w.bin.json", len(content), 2, complete=True)
        with up_relays.scope() as scope:
            up_relays.fed_by(scope.start(digest, len(content), up_staging / "w.bin", up_staging / "w.bin.json"), ())
            assert server.downstreams.admit(digest, "another:1")  # it serves another node
            slots = FakeSlots()
            slots.free.set()  # the origin slot is free: only the busy holder keeps this fetch from the origin
            gate = OriginGate(slots.hold, "hf://o/m", lambda: None, None)  # type: ignore[arg-type]
            fetcher, relays = _relay_fetcher(FakeDirectory([address]))
            token = ORIGIN_GATE.set(gate)
            try:
                task = asyncio.create_task(_relayed(fetcher, relays, tmp_path / "staging", content, lambda _n: None))
                await until(lambda: server.downstreams.refused >= 2, "asked twice, busy twice")
                assert not task.done() and slots.entered == 0
                server.downstreams.release(digest, "another:1", now=-1e9)  # the other node is done
                async with asyncio.timeout(20):
                    got, _ = await task
            finally:
                ORIGIN_GATE.reset(token)
    assert got is not None and slots.entered == 0


# ---------------------------------------------------------------- held probes (X-Peer-Wait)


def _patient_fetcher(directory: FakeDirectory) -> tuple[PeerFetcher, Relays]:
    """A relaying fetcher whose rounds are an hour apart: only a held probe can end its pause in time."""
    return _relay_fetcher(directory, retry_s=3600.0, feed_wait_s=30.0)


async def test_a_node_follows_its_upstream_the_moment_the_upstream_is_fed(tmp_path: Path) -> None:
    content = os.urandom(2 * PART + 5)
    digest = hashlib.sha256(content).hexdigest()
    async with relay_peer(tmp_path) as (address, _server, up_relays, up_staging):
        path, state_path = up_staging / "w.bin", up_staging / "w.bin.json"
        path.write_bytes(content)
        _record(state_path, len(content), 3, complete=True)
        with up_relays.scope() as scope:
            upstream = scope.start(digest, len(content), path, state_path)  # fetching it too, no source yet
            fetcher, relays = _patient_fetcher(FakeDirectory([], fetching=[address]))
            fetch = asyncio.ensure_future(_relayed_fetch(fetcher, relays, tmp_path / "staging", content, _no_bytes))
            await until(lambda: upstream._changed is not None, what="this node's probe held at its upstream")
            up_relays.fed_by(upstream, ("10.0.0.1:1",))
            async with asyncio.timeout(30):  # (the next round would be an hour away)
                got, relay = await fetch
    assert got is not None and got.digests["sha256"] == digest
    assert relay.upstream == (address, "10.0.0.1:1")


async def test_a_slot_won_while_a_probe_is_held_goes_to_the_origin_without_waiting_for_the_probe(
    tmp_path: Path,
) -> None:
    content = os.urandom(PART)
    digest = hashlib.sha256(content).hexdigest()
    answers: list[tuple[str, int]] = []
    async with relay_peer(tmp_path) as (address, server, up_relays, up_staging):
        server.on_answer = lambda method, status: answers.append((method, status))
        with up_relays.scope() as scope:
            upstream = scope.start(digest, len(content), up_staging / "w.bin", up_staging / "w.bin.json")
            slots = FakeSlots()
            gate = OriginGate(slots.hold, "hf://o/m", lambda: None, None)  # type: ignore[arg-type]
            fetcher, relays = _patient_fetcher(FakeDirectory([], fetching=[address]))
            token = ORIGIN_GATE.set(gate)
            try:
                fetch = asyncio.ensure_future(_relayed(fetcher, relays, tmp_path / "staging", content, _no_bytes))
                await until(lambda: upstream._changed is not None, what="this node's probe held at its upstream")
                slots.free.set()
                async with asyncio.timeout(30):
                    got, _ = await fetch
            finally:
                ORIGIN_GATE.reset(token)
            # The held probe is still held (the upstream answers it when its wait ends): the fetch did not wait.
            assert answers == [("HEAD", 404)]
    assert got is None and gate.holding


def _no_bytes(_n: int) -> None:
    pass


@pytest.mark.parametrize(("files", "slots"), [(1, 8), (4, 8), (8, 16), (16, 32)])
async def test_a_peer_session_has_a_slot_for_every_part_request_its_files_may_have(files: int, slots: int) -> None:
    fetcher = PeerFetcher(FakeDirectory([]), Bans(60), lambda: "good", ranged=RangedConfig(concurrency=8))  # type: ignore[arg-type]
    async with fetcher.session(files) as engine:
        assert engine.config.concurrency == slots == max(8, files * PARTS_AT_ONCE)
