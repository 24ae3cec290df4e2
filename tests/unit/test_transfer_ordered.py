"""The hash in file order: bytes at the hash cursor hashed from the receive buffer, the rest read back, once each.

What must hold whatever feeds the hash: every byte of the file is hashed exactly once, at its offset, after it
is in the file; the digest is the file's; a resumed download re-hashes its durable prefix from disk; a corrupt
byte fails verification on either way of hashing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_agent.sources.base import SourceError
from model_agent.transfer import Downloaded, Expected, RangedConfig, RangedDownloader, hashing, splice
from tests.support.waiting import eventually
from tests.unit.test_transfer import digests, origin_for

KiB = 1024
MiB = 1024 * KiB
# One slot, one stream: every byte arrives in file order (the shape of a file of one part, or a single stream).
IN_ORDER = RangedConfig(part_size=256 * KiB, concurrency=1, write_buffer=64 * KiB, backoff_base_s=0.01)
PARALLEL = RangedConfig(part_size=256 * KiB, concurrency=4, write_buffer=64 * KiB, backoff_base_s=0.01)


class HashFeeds:
    """Counts what each way of hashing fed, per hasher (the engine's hashing functions wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.from_buffers: dict[int, int] = {}
        self.read_back: dict[int, list[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        real_buffer, real_mapped = hashing.hash_buffer, hashing.hash_mapped

        def hash_buffer(hasher: hashing.Hasher, data: bytes | memoryview) -> None:
            with self._lock:
                self.from_buffers[id(hasher)] = self.from_buffers.get(id(hasher), 0) + len(data)
            real_buffer(hasher, data)

        def hash_mapped(fd: int, hasher: hashing.Hasher, offset: int, length: int) -> None:
            with self._lock:
                self.read_back.setdefault(id(hasher), []).append((offset, length))
            real_mapped(fd, hasher, offset, length)

        monkeypatch.setattr(hashing, "hash_buffer", hash_buffer)
        monkeypatch.setattr(hashing, "hash_mapped", hash_mapped)

    def buffered(self) -> int:
        return max(self.from_buffers.values(), default=0)

    def read(self) -> int:
        return max((sum(n for _, n in spans) for spans in self.read_back.values()), default=0)

    def every_hasher_fed(self, size: int) -> bool:
        hashers = set(self.from_buffers) | set(self.read_back)
        return bool(hashers) and all(
            self.from_buffers.get(h, 0) + sum(n for _, n in self.read_back.get(h, [])) == size for h in hashers
        )


_OPEN: list[RangedDownloader] = []


def engine(config: RangedConfig) -> RangedDownloader:
    dl = RangedDownloader(config=config)
    _OPEN.append(dl)
    return dl


async def fetched(config: RangedConfig, data: bytes, dest: Path, *, delay: float = 0.0) -> Downloaded:
    """``data`` from a loopback origin (``delay`` seconds after each chunk), downloaded by an engine with ``config``."""
    origin = await origin_for(data)
    origin.delay = delay
    try:
        return await engine(config).download(origin.url, dest, Expected(len(data), digests(data)))
    finally:
        await origin.stop()


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


@pytest.fixture
def copying(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every body through the slot's buffer (as over TLS, where nothing can be spliced)."""
    monkeypatch.setattr(splice, "SUPPORTED", False)


# ---------------------------------------------------------------------------------------------- the cursor


def test_offers_in_file_order_are_hashed_and_others_are_left_for_the_read_back() -> None:
    moves: list[int] = []
    h = hashlib.sha256()
    ordered = hashing.OrderedHash([h], moves.append)
    assert ordered.offer(0, b"abc")
    assert not ordered.offer(10, b"later")  # ahead of the cursor: not hashed, not held
    assert not ordered.offer(0, b"abc")  # behind it: already hashed
    assert ordered.offer(3, b"def")
    assert ordered.claim(6, 4) and not ordered.claim(6, 4)  # one feeder at a time
    assert not ordered.offer(6, b"xxxx")  # inside the claimed range: the read-back's
    ordered.hashers[0].update(b"ghij")
    ordered.advance(4)
    assert ordered.pos == 10 and moves == [3, 6, 10]
    assert h.hexdigest() == hashlib.sha256(b"abcdefghij").hexdigest()


async def test_an_offer_right_after_a_read_back_waits_for_it_then_is_hashed() -> None:
    h = hashlib.sha256()
    ordered = hashing.OrderedHash([h], lambda _pos: None)
    assert ordered.claim(0, 4)
    result: list[bool] = []
    receiver = threading.Thread(target=lambda: result.append(ordered.offer(4, b"tail")))
    receiver.start()

    async def waiting() -> bool:
        return receiver.is_alive() and not result

    await eventually(waiting, timeout=5, what="the receive thread waiting for the read-back", interval=0.01)
    h.update(b"head")
    ordered.advance(4)
    await asyncio.to_thread(receiver.join, 5)
    assert result == [True] and ordered.pos == 8
    assert h.hexdigest() == hashlib.sha256(b"headtail").hexdigest()


async def test_a_read_back_advances_when_its_threads_end_even_if_nobody_waits() -> None:
    """The cursor is moved by the hashing threads themselves: a cancelled hash loop cannot leave it claimed."""
    ordered = hashing.OrderedHash([hashlib.sha256(), hashlib.md5()], lambda _pos: None)
    assert ordered.claim(0, 8)
    gate = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        running = [pool.submit(gate.wait, 5) for _ in ordered.hashers]
        ordered.advance_when_done(running, 8)
        assert ordered.pos == 0 and ordered.busy
        gate.set()

        async def moved() -> bool:
            return ordered.pos == 8 and not ordered.busy

        await eventually(moved, timeout=5, what="the cursor past the read-back", interval=0.01)
    finally:
        gate.set()
        pool.shutdown()


# ---------------------------------------------------------------------------------------------- the engine


async def test_bytes_arriving_in_order_are_hashed_from_the_buffer_never_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copying: None
) -> None:
    data = os.urandom(2 * MiB + 5)
    feeds = HashFeeds(monkeypatch)
    got = await fetched(IN_ORDER, data, tmp_path / "f")
    assert got.digests == digests(data)
    assert feeds.buffered() == len(data) and feeds.read() == 0
    assert feeds.every_hasher_fed(len(data))


async def test_parts_ahead_of_the_cursor_are_read_back_and_every_byte_is_hashed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copying: None
) -> None:
    data = os.urandom(4 * MiB + 123)
    feeds = HashFeeds(monkeypatch)
    got = await fetched(PARALLEL, data, tmp_path / "f", delay=0.001)  # parts interleave: most land ahead of the cursor
    assert got.digests == digests(data)
    assert feeds.buffered() > 0 and feeds.read() > 0  # both ways took part
    assert feeds.every_hasher_fed(len(data))
    for spans in feeds.read_back.values():  # read-backs never overlap (nor, by the count above, leave a gap)
        ordered_spans = sorted(spans)
        assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(ordered_spans))


async def test_spliced_bodies_are_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not splice.SUPPORTED:
        pytest.fail("splice(2) is expected on this platform (Linux)")
    data = os.urandom(2 * MiB)
    feeds = HashFeeds(monkeypatch)
    got = await fetched(IN_ORDER, data, tmp_path / "f")
    assert got.digests == digests(data)
    assert feeds.read() >= len(data) - 64 * KiB  # only http.client's read-ahead went through a buffer
    assert feeds.every_hasher_fed(len(data))


async def test_a_flipped_byte_hashed_from_the_buffer_fails_verification(tmp_path: Path, copying: None) -> None:
    data = os.urandom(1 * MiB)
    origin = await origin_for(data)
    origin.flip_at = 300_001
    dest = tmp_path / "f"
    try:
        with pytest.raises(SourceError) as err:
            await engine(IN_ORDER).download(origin.url, dest, Expected(len(data), digests(data)))
    finally:
        await origin.stop()
    assert err.value.reason == "VerificationFailed"
    assert not dest.exists()


async def test_a_resumed_download_rehashes_its_durable_prefix_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copying: None
) -> None:
    data = os.urandom(4 * MiB)
    origin = await origin_for(data)
    origin.delay = 0.004  # slow enough to be cancelled half-way
    dest = tmp_path / "f"
    expected = Expected(len(data), digests(data), '"v1"')
    written = 0
    half = asyncio.Event()

    def on_bytes(n: int) -> None:
        nonlocal written
        written += n
        if written >= len(data) // 2:
            half.set()

    try:
        task = asyncio.ensure_future(engine(PARALLEL).download(origin.url, dest, expected, on_bytes=on_bytes))
        await asyncio.wait([task, asyncio.ensure_future(half.wait())], return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), "the download finished before it could be cancelled"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        feeds = HashFeeds(monkeypatch)
        origin.delay = 0.0
        got = await engine(PARALLEL).download(origin.url, dest, expected)
    finally:
        await origin.stop()
    assert got.digests == digests(data) and dest.read_bytes() == data
    assert got.resumed_bytes > 0
    assert feeds.read() >= got.resumed_bytes  # nothing of the last run's hash was kept: all of it read back
    assert feeds.every_hasher_fed(len(data))
