"""The transfer engine against a small real HTTP origin (aiohttp on loopback) with injectable faults."""

from __future__ import annotations

import asyncio
import base64
import datetime
import errno
import hashlib
import ipaddress
import itertools
import json
import os
import ssl
import sys
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import google_crc32c
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from model_agent.local.capacity import CapacityRegistry, DiskReserve, DiskUsage
from model_agent.sources.base import SourceError
from model_agent.transfer import Expected, RangedConfig, RangedDownloader, fetched_in_one_request, hashing, job, splice
from model_agent.transfer.partmap import PartMap
from model_agent.transfer.transport import no_proxy_matches
from tests.support.waiting import eventually, until

KiB = 1024
MiB = 1024 * KiB


class Origin:
    """Serves one byte string at ``/file`` with Range, If-Match and faults; counts what it sends."""

    def __init__(self, data: bytes, etag: str = '"v1"') -> None:
        self.data = data
        self.etag = etag
        self.ranges: list[str | None] = []
        self.statuses: list[int] = []
        self.bytes_sent = 0
        self.chunk = 64 * KiB
        self.delay = 0.0  # seconds to sleep after each chunk
        self.stall: asyncio.Event | None = None  # when given, every response stops after one chunk until it is set
        self.cut_after: int | None = None  # the next response is cut after this many body bytes
        self.busy: int = 0  # answer this many requests with 503
        self.retry_after: str | None = "1"
        self.flip_at: int | None = None  # flip this byte of the file in every response that covers it
        self.ignore_range = False
        self.chunked = False  # answer without Content-Length (chunked transfer encoding, as some mirrors do)
        self.status: int | None = None  # answer every request with this status
        self.signatures: list[str] = []  # X-Signature of every request that had one
        self.targets: list[str] = []  # request targets as sent (absolute when the client talks to a proxy)
        self.hosts: list[str] = []
        self.answer_headers: dict[str, str] = {}  # added to every 200/206 answer
        self.in_flight = 0  # requests being answered now
        self.arrivals: list[tuple[int, int]] = []  # at each request's arrival: (requests in flight, body bytes sent)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_get("/file", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/file"

    async def stop(self) -> None:
        if self.stall is not None:
            self.stall.set()
        if self.runner is not None:
            await self.runner.cleanup()

    def _answer(self, status: int, headers: dict[str, str] | None = None) -> web.Response:
        self.statuses.append(status)
        return web.Response(status=status, headers=headers)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.arrivals.append((self.in_flight, self.bytes_sent))
        try:
            return await self._answer_request(request)
        finally:
            self.in_flight -= 1

    async def _answer_request(self, request: web.Request) -> web.StreamResponse:
        rng = request.headers.get("Range")
        self.ranges.append(rng)
        self.targets.append(request.raw_path if "://" not in str(request.url) else str(request.url))
        self.hosts.append(request.headers.get("Host", ""))
        if "X-Signature" in request.headers:
            self.signatures.append(request.headers["X-Signature"])
        if self.status is not None:
            return self._answer(self.status)
        if self.busy > 0:
            self.busy -= 1
            return self._answer(503, {"Retry-After": self.retry_after} if self.retry_after else None)
        match = request.headers.get("If-Match")
        if match is not None and match != self.etag:
            return self._answer(412)
        size = len(self.data)
        start, end, status = 0, size - 1, 200
        headers = {"ETag": self.etag, "Accept-Ranges": "bytes", **self.answer_headers}
        if rng and not self.ignore_range:
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start, end = int(first), min(size - 1, int(last)) if last else size - 1
            if start >= size:
                return self._answer(416)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        body = bytearray(self.data[start : end + 1])
        if self.flip_at is not None and start <= self.flip_at <= end:
            body[self.flip_at - start] ^= 0xFF
        self.statuses.append(status)
        resp = web.StreamResponse(status=status, headers=headers)
        if self.chunked:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = len(body)
        await resp.prepare(request)
        sent = 0
        for off in range(0, len(body), self.chunk):
            piece = bytes(body[off : off + self.chunk])
            if self.cut_after is not None and sent + len(piece) > self.cut_after:
                piece = piece[: self.cut_after - sent]
                self.cut_after = None
                await resp.write(piece)
                self.bytes_sent += len(piece)
                assert request.transport is not None
                request.transport.close()
                return resp
            await resp.write(piece)
            self.bytes_sent += len(piece)
            sent += len(piece)
            if self.stall is not None:
                await self.stall.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
        await resp.write_eof()
        return resp


_OPEN: list[RangedDownloader] = []


def engine(config: RangedConfig) -> RangedDownloader:
    """A downloader whose connections are closed after the test."""
    dl = RangedDownloader(config=config)
    _OPEN.append(dl)
    return dl


@pytest.fixture(autouse=True, params=["splice", "copy"])
def receive_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs over both receive paths: splice(2) (plain HTTP on Linux) and copying through a buffer."""
    if request.param == "copy":
        monkeypatch.setattr(splice, "SUPPORTED", False)
    return str(request.param)


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


async def origin_for(data: bytes, **kw: Any) -> Origin:
    o = Origin(data, **kw)
    await o.start()
    return o


def digests(data: bytes) -> dict[str, str]:
    return {
        "md5": hashlib.md5(data).hexdigest(),
        "sha256": hashlib.sha256(data).hexdigest(),
        "crc32": f"{zlib.crc32(data):08x}",
        "crc32c": google_crc32c.Checksum(data).digest().hex(),  # type: ignore[no-untyped-call]
    }


def done_parts(state_path: Path) -> tuple[int, list[int]]:
    doc = json.loads(state_path.read_bytes())
    bits = base64.b64decode(doc["done"])
    parts = (doc["size"] + doc["part_size"] - 1) // doc["part_size"]
    return doc["part_size"], [i for i in range(parts) if bits[i >> 3] & (1 << (i & 7))]


FAST = RangedConfig(part_size=256 * KiB, concurrency=4, write_buffer=64 * KiB, backoff_base_s=0.01)


async def test_parallel_download_is_byte_identical_and_verified(tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 12345)
    origin = await origin_for(data)
    try:
        dest = tmp_path / "out.bin"
        seen: list[int] = []
        got = await engine(FAST).download(
            origin.url, dest, Expected(len(data), digests(data), '"v1"'), on_bytes=seen.append
        )
    finally:
        await origin.stop()
    assert dest.read_bytes() == data
    assert got.digests == digests(data)
    assert got.fetched_bytes == len(data) == sum(seen)
    assert got.resumed_bytes == 0
    parts = (len(data) + FAST.part_size - 1) // FAST.part_size
    assert len(origin.ranges) == got.requests == parts
    assert all(r is not None and r.startswith("bytes=") for r in origin.ranges)
    assert origin.bytes_sent == len(data)
    state = json.loads(Path(f"{dest}.parts.json").read_bytes())
    assert state["complete"] is True and state["digests"]["sha256"] == digests(data)["sha256"]


async def test_the_receive_stays_within_one_round_of_slots_of_the_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sha256 is sequential and the receive is parallel: with a hash slower than the link, the transfer is held
    to concurrency x part_size ahead of the hashed prefix, so the last byte is verified moments after it lands
    (unbounded, the transfer ended with most of the file still to hash, one core idle meanwhile)."""
    data = os.urandom(8 * MiB)
    origin = await origin_for(data)
    hashed = 0
    written = 0
    widest = 0
    real_mapped, real_buffer, real_advance = hashing.hash_mapped, hashing.hash_buffer, hashing.OrderedHash.advance

    # a hash far slower than loopback, both ways of hashing (the thing under test, not a synchronisation)
    def slow_mapped(fd: int, hasher: hashing.Hasher, offset: int, length: int) -> None:
        time.sleep(0.02)
        real_mapped(fd, hasher, offset, length)

    def slow_buffer(hasher: hashing.Hasher, data: bytes | memoryview) -> None:
        time.sleep(0.005)
        real_buffer(hasher, data)

    def advance(self: hashing.OrderedHash, length: int) -> None:
        # (counted before the real advance: it wakes the event loop, which may start parts and report their bytes
        # before this thread runs again; counted after, a loaded machine showed a gap the engine never had)
        nonlocal hashed
        hashed = max(hashed, self.pos + length)
        real_advance(self, length)

    def on_bytes(n: int) -> None:
        nonlocal written, widest
        written += n
        widest = max(widest, written - hashed)

    monkeypatch.setattr(hashing, "hash_mapped", slow_mapped)
    monkeypatch.setattr(hashing, "hash_buffer", slow_buffer)
    monkeypatch.setattr(hashing.OrderedHash, "advance", advance)
    try:
        got = await engine(FAST).download(
            origin.url, tmp_path / "f", Expected(len(data), digests(data)), on_bytes=on_bytes
        )
    finally:
        await origin.stop()
    assert got.digests == digests(data)
    # a part may start while its first byte is inside the lead, so one part more than the lead can be unhashed
    assert widest <= FAST.concurrency * FAST.part_size + FAST.part_size


async def test_plain_http_bodies_take_the_receive_path_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receive_path: str
) -> None:
    """On Linux a plain-HTTP body is spliced from the socket into the file; only http.client's few KiB of
    read-ahead past the headers go through a buffer. With splice off, every byte is copied."""
    data = os.urandom(3 * MiB)
    copied = spliced = 0
    real_pwrite, real_splice = job._pwrite_all, splice.write_from_pipe

    def counting_pwrite(fd: int, view: memoryview, offset: int) -> None:
        nonlocal copied
        copied += len(view)
        real_pwrite(fd, view, offset)

    def counting_splice(pipe_fd: int, fd: int, count: int, pos: int) -> int:
        nonlocal spliced
        n = real_splice(pipe_fd, fd, count, pos)
        spliced += n
        return n

    monkeypatch.setattr(job, "_pwrite_all", counting_pwrite)
    monkeypatch.setattr(splice, "write_from_pipe", counting_splice)
    origin = await origin_for(data)
    dl = engine(FAST)
    try:
        got = await dl.download(origin.url, tmp_path / "f", Expected(len(data), digests(data)))
    finally:
        await origin.stop()
    assert got.digests == digests(data)
    assert copied + spliced == len(data)
    buffers = [slot._buffer for slot in dl._all]
    if receive_path == "splice" and sys.platform.startswith("linux"):
        parts = len(data) // FAST.part_size
        assert copied <= parts * 8 * KiB  # at most http.client's read-ahead per response
        assert buffers and all(b is None for b in buffers)  # no slot made a receive buffer it did not need
    else:
        assert spliced == 0 and all(b is not None for b in buffers)


async def test_completed_file_is_not_fetched_again(tmp_path: Path) -> None:
    data = os.urandom(700 * KiB)
    origin = await origin_for(data)
    try:
        dl = engine(FAST)
        await dl.download(origin.url, tmp_path / "f", Expected(len(data), {"md5": digests(data)["md5"]}, '"v1"'))
        before = len(origin.ranges)
        again = await dl.download(
            origin.url, tmp_path / "f", Expected(len(data), {"md5": digests(data)["md5"]}, '"v1"')
        )
    finally:
        await origin.stop()
    assert len(origin.ranges) == before
    assert again.requests == 0 and again.fetched_bytes == 0 and again.resumed_bytes == len(data)
    assert again.digests["md5"] == digests(data)["md5"]


async def test_a_complete_map_of_other_bytes_is_not_taken_for_the_expected_file(tmp_path: Path) -> None:
    """Same path and size, another expected sha256 (a branch moved; fine-tuned weights keep their shapes): the
    complete map left by the first fetch describes other bytes, so the file is fetched again and verified."""
    first, second = os.urandom(700 * KiB), os.urandom(700 * KiB)
    old_origin, new_origin = await origin_for(first), await origin_for(second)
    try:
        dl = engine(FAST)
        await dl.download(old_origin.url, tmp_path / "f", Expected(len(first), {"sha256": digests(first)["sha256"]}))
        again = await dl.download(
            new_origin.url, tmp_path / "f", Expected(len(second), {"sha256": digests(second)["sha256"]})
        )
    finally:
        await old_origin.stop()
        await new_origin.stop()
    assert again.fetched_bytes == len(second) and again.requests > 0
    assert again.digests["sha256"] == digests(second)["sha256"]
    assert (tmp_path / "f").read_bytes() == second


async def test_small_file_is_one_plain_get(tmp_path: Path) -> None:
    data = b'{"architectures": ["X"]}'
    origin = await origin_for(data)
    try:
        got = await engine(FAST).download(origin.url, tmp_path / "config.json", Expected(len(data)))
    finally:
        await origin.stop()
    assert origin.ranges == [None]
    assert (tmp_path / "config.json").read_bytes() == data
    assert got.digests == {"sha256": hashlib.sha256(data).hexdigest()}


async def test_small_files_in_flight_follow_the_origins_wait(tmp_path: Path) -> None:
    """Small files start two at a time (transfer.pacing); an origin that keeps each waiting opens every slot."""
    data = os.urandom(4 * KiB)
    origin = Origin(data)
    origin.chunk = 1 * KiB
    origin.delay = 0.02  # after each KiB: every file waits about 80 ms on its origin for a millisecond of work
    await origin.start()
    config = replace(FAST, concurrency=8)
    try:
        dl = engine(config)
        files = [tmp_path / f"f{i}" for i in range(24)]
        await asyncio.gather(*(dl.download(origin.url, f, Expected(len(data), digests(data))) for f in files))
    finally:
        await origin.stop()
    # Until a whole file was sent (and so before any was measured): two at once.
    assert max(n for n, sent in origin.arrivals if sent < len(data)) == 2
    assert (
        max(n for n, _ in origin.arrivals) == config.concurrency
    )  # then as many as the slots, each waiting on the origin
    assert all(f.read_bytes() == data for f in files)


async def test_small_file_is_recorded_only_once_complete_and_not_fetched_again(tmp_path: Path) -> None:
    data = os.urandom(100 * KiB)
    origin = await origin_for(data)
    origin.stall = asyncio.Event()  # the first chunk, then nothing until set
    dest, state = tmp_path / "f", tmp_path / "f.parts.json"
    try:
        dl = engine(FAST)
        task = asyncio.ensure_future(dl.download(origin.url, dest, Expected(len(data), digests(data), '"v1"')))

        async def first_chunk_written() -> bool:
            return dest.exists() and origin.bytes_sent > 0

        await eventually(first_chunk_written, timeout=10, what="the first chunk of the small file")
        assert not state.exists()  # nothing is recorded before completion (a kill re-fetches this one part)
        origin.stall.set()
        await task
        assert json.loads(state.read_text())["complete"] is True
        before = len(origin.ranges)
        again = await dl.download(origin.url, dest, Expected(len(data), digests(data), '"v1"'))
    finally:
        await origin.stop()
    assert len(origin.ranges) == before
    assert again.requests == 0 and again.fetched_bytes == 0 and again.resumed_bytes == len(data)


async def test_a_torn_completion_record_of_a_small_file_is_trusted_for_nothing(tmp_path: Path) -> None:
    """A kill while the record of a small file is written leaves part of it: the file is fetched again, whole."""
    data = os.urandom(100 * KiB)
    origin = await origin_for(data)
    dest, state = tmp_path / "f", tmp_path / "f.parts.json"
    dest.write_bytes(data)
    state.write_bytes(b'{"complete": true, "digests": {"sha2')
    try:
        got = await engine(FAST).download(origin.url, dest, Expected(len(data), digests(data), '"v1"'))
    finally:
        await origin.stop()
    assert origin.ranges == [None] and got.fetched_bytes == len(data)
    assert json.loads(state.read_text())["complete"] is True


async def test_a_small_file_is_recorded_complete_over_an_unfinished_map_of_its_own(tmp_path: Path) -> None:
    """An unfinished map that still fits (no part done) stays where it is until the record replaces it."""
    data = os.urandom(100 * KiB)
    origin = await origin_for(data)
    dest, state = tmp_path / "f", tmp_path / "f.parts.json"
    dest.write_bytes(bytes(len(data)))
    state.write_bytes(PartMap.fresh(len(data), FAST.part_size, '"v1"').to_json())
    try:
        await engine(FAST).download(origin.url, dest, Expected(len(data), digests(data), '"v1"'))
    finally:
        await origin.stop()
    assert dest.read_bytes() == data
    assert json.loads(state.read_text())["complete"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "f.parts.json"]


async def test_small_file_with_a_flipped_byte_is_refused_and_deleted(tmp_path: Path) -> None:
    data = os.urandom(150 * KiB)
    origin = await origin_for(data)
    origin.flip_at = 150 * KiB - 1
    dest = tmp_path / "f"
    try:
        with pytest.raises(SourceError) as err:
            await engine(FAST).download(origin.url, dest, Expected(len(data), {"sha256": digests(data)["sha256"]}))
    finally:
        await origin.stop()
    assert err.value.reason == "VerificationFailed" and "sha256" in err.value.message
    assert not dest.exists() and not Path(f"{dest}.parts.json").exists()


def _stated_md5(headers: Mapping[str, str]) -> Mapping[str, str]:
    return {"md5": headers["x-content-md5"]} if "x-content-md5" in headers else {}


async def test_a_small_file_is_verified_against_the_checksums_its_answer_states(tmp_path: Path) -> None:
    """One request, no HEAD: the answer's own checksum (read from its headers before the body is hashed) is checked;
    a byte flipped in the body, or a stated checksum that is not the body's, fails verification and leaves nothing."""
    data = os.urandom(120 * KiB)
    md5 = hashlib.md5(data).hexdigest()
    expected = Expected(len(data), validator='"v1"', checksums_from_answer=_stated_md5)
    origin = await origin_for(data)
    try:
        origin.answer_headers = {"X-Content-MD5": md5.upper()}
        got = await engine(FAST).download(origin.url, tmp_path / "ok", expected)
        assert got.digests == {"md5": md5, "sha256": hashlib.sha256(data).hexdigest()}
        assert origin.ranges == [None]
        origin.flip_at = 1000
        with pytest.raises(SourceError) as flipped:
            await engine(FAST).download(origin.url, tmp_path / "flipped", expected)
        origin.flip_at = None
        origin.answer_headers = {"X-Content-MD5": hashlib.md5(b"another").hexdigest()}
        with pytest.raises(SourceError) as lied:
            await engine(FAST).download(origin.url, tmp_path / "lied", expected)
    finally:
        await origin.stop()
    for err in (flipped, lied):
        assert err.value.reason == "VerificationFailed" and "md5" in err.value.message
    assert not (tmp_path / "flipped").exists() and not (tmp_path / "lied").exists()


async def test_checksums_from_the_answer_are_refused_for_a_file_of_several_parts(tmp_path: Path) -> None:
    """A ranged answer does not describe the whole object: only a file fetched in one request may take them."""
    data = os.urandom(3 * FAST.part_size)
    assert not fetched_in_one_request(len(data), FAST.part_size)
    origin = await origin_for(data)
    try:
        with pytest.raises(ValueError, match="one request"):
            await engine(FAST).download(
                origin.url, tmp_path / "f", Expected(len(data), checksums_from_answer=_stated_md5)
            )
    finally:
        await origin.stop()
    assert origin.ranges == []


async def test_empty_file_needs_no_request(tmp_path: Path) -> None:
    got = await engine(FAST).download(
        "http://127.0.0.1:9/never", tmp_path / "empty", Expected(0, {"md5": hashlib.md5(b"").hexdigest()})
    )
    assert got.requests == 0 and (tmp_path / "empty").read_bytes() == b""


@pytest.mark.parametrize(
    ("size", "cut"),
    [
        (2 * MiB, 100 * KiB + 7),  # parts of 256 KiB: the part that was cut is asked again from its last byte
        # one small part, fetched in one thread call per attempt (job._run_small): asked again from the last byte
        # written, the hash (fed from the buffer) going on from there
        (200 * KiB, 64 * KiB + 5),
    ],
)
async def test_cut_connection_resumes_within_the_part(tmp_path: Path, size: int, cut: int) -> None:
    data = os.urandom(size)
    origin = await origin_for(data)
    origin.cut_after = cut
    try:
        got = await engine(FAST).download(origin.url, tmp_path / "f", Expected(len(data), digests(data)))
    finally:
        await origin.stop()
    assert (tmp_path / "f").read_bytes() == data
    parts = -(-len(data) // FAST.part_size)
    assert got.requests == parts + 1  # one retry
    assert origin.ranges[-1] is not None and origin.ranges[-1].startswith("bytes=")
    # The retry asked only for what was missing: nothing was sent twice except bytes lost in transit.
    assert origin.bytes_sent - len(data) <= cut


async def test_503_with_retry_after_is_honoured(tmp_path: Path) -> None:
    data = os.urandom(600 * KiB)
    origin = await origin_for(data)
    origin.busy = 1
    origin.retry_after = "1"
    try:
        started = time.monotonic()
        await engine(FAST).download(origin.url, tmp_path / "f", Expected(len(data), digests(data)))
        elapsed = time.monotonic() - started
    finally:
        await origin.stop()
    assert origin.statuses.count(503) == 1
    assert elapsed >= 0.95  # the answered part waited the announced second (and the others paused too)
    assert (tmp_path / "f").read_bytes() == data


async def test_persistent_5xx_gives_up_with_a_reason(tmp_path: Path) -> None:
    data = os.urandom(300 * KiB)
    origin = await origin_for(data)
    origin.status = 500
    cfg = RangedConfig(part_size=256 * KiB, concurrency=2, backoff_base_s=0.001, max_attempts=3)
    try:
        with pytest.raises(SourceError) as err:
            await engine(cfg).download(origin.url, tmp_path / "f", Expected(len(data)), label="m/f")
    finally:
        await origin.stop()
    assert err.value.reason == "DownloadFailed"
    assert "m/f" in err.value.message and "HTTP 500" in err.value.message
    assert "127.0.0.1" not in err.value.message  # URLs (which may be presigned) never appear in messages


async def download_with_flip(tmp_path: Path, flip_at: int, checksums: Callable[[bytes], dict[str, str]]) -> SourceError:
    """Download 1 MiB whose byte ``flip_at`` the origin flips; the engine's error (it must refuse the file)."""
    data = os.urandom(1 * MiB)
    origin = await origin_for(data)
    origin.flip_at = flip_at
    dest = tmp_path / "f"
    try:
        with pytest.raises(SourceError) as err:
            await engine(FAST).download(origin.url, dest, Expected(len(data), checksums(data)))
    finally:
        await origin.stop()
    assert err.value.reason == "VerificationFailed"
    assert not dest.exists() and not Path(f"{dest}.parts.json").exists()
    return err.value


async def test_flipped_byte_is_detected(tmp_path: Path) -> None:
    error = await download_with_flip(tmp_path, 777_777, digests)
    assert "md5" in error.message and "sha256" in error.message


@pytest.mark.parametrize("algorithm", ["crc32c", "crc32", "md5"])
async def test_a_flipped_byte_is_caught_by_each_checksum_alone(tmp_path: Path, algorithm: str) -> None:
    """A source that publishes only this checksum (e.g. a composite GCS object: only CRC32C) still catches it."""
    error = await download_with_flip(tmp_path, 123_457, lambda data: {algorithm: digests(data)[algorithm]})
    assert algorithm in error.message


async def test_changed_object_is_refused(tmp_path: Path) -> None:
    data = os.urandom(600 * KiB)
    origin = await origin_for(data, etag='"v2"')
    try:
        with pytest.raises(SourceError) as err:
            await engine(FAST).download(origin.url, tmp_path / "f", Expected(len(data), {}, '"v1"'))
    finally:
        await origin.stop()
    assert err.value.reason == "SourceChanged"


@pytest.mark.parametrize("slots", [1, FAST.concurrency])
async def test_server_ignoring_range_is_read_as_one_stream_from_the_first_parts_answer(
    tmp_path: Path, slots: int
) -> None:
    """The whole body a server sends for the first part's ranged request is read on to the end of the file, not
    dropped and asked for again: one request per file, plus those already sent for other parts (dropped)."""
    data = os.urandom(1 * MiB + 3)
    origin = await origin_for(data)
    origin.ignore_range = True
    try:
        got = await engine(replace(FAST, concurrency=slots)).download(
            origin.url, tmp_path / "f", Expected(len(data), digests(data)), state_path=tmp_path / "f.parts"
        )
    finally:
        await origin.stop()
    assert (tmp_path / "f").read_bytes() == data
    assert got.digests == digests(data)
    assert None not in origin.ranges  # no second, plain GET
    # The first part was asked (with several slots its request need not arrive first) and no more than one per slot.
    assert f"bytes=0-{FAST.part_size - 1}" in origin.ranges and len(origin.ranges) == got.requests <= slots
    state = PartMap.read(tmp_path / "f.parts")
    assert state is not None and state.complete


async def test_server_ignoring_range_for_a_resumed_file_is_read_as_one_stream_from_0(tmp_path: Path) -> None:
    """A resumed file whose first part is done asks for a later part: a whole answer to that cannot be read on
    (it starts at 0), so the file is read again as one plain stream."""
    data = os.urandom(1 * MiB + 3)
    state = PartMap.fresh(len(data), FAST.part_size, None)
    state.mark(0)
    (tmp_path / "f").write_bytes(data[: FAST.part_size] + bytes(len(data) - FAST.part_size))
    state.save(tmp_path / "f.parts")
    origin = await origin_for(data)
    origin.ignore_range = True
    try:
        got = await engine(replace(FAST, concurrency=1)).download(
            origin.url, tmp_path / "f", Expected(len(data), digests(data)), state_path=tmp_path / "f.parts"
        )
    finally:
        await origin.stop()
    assert (tmp_path / "f").read_bytes() == data and got.digests == digests(data)
    assert origin.ranges == [f"bytes={FAST.part_size}-{2 * FAST.part_size - 1}", None]


async def test_parts_at_once_caps_one_files_requests_in_flight(tmp_path: Path) -> None:
    """A file given ``parts_at_once`` never has more part requests in flight, whatever the session's slots."""
    data = os.urandom(8 * FAST.part_size)
    origin = Origin(data)
    origin.delay = 0.005  # parts overlap
    await origin.start()
    try:
        dl = engine(FAST)
        capped = await dl.download(origin.url, tmp_path / "a", Expected(len(data), digests(data)), parts_at_once=2)
        assert max(n for n, _ in origin.arrivals) == 2 and capped.digests == digests(data)
        origin.arrivals.clear()
        await dl.download(origin.url, tmp_path / "b", Expected(len(data), digests(data)))
        assert (
            max(n for n, _ in origin.arrivals) == FAST.concurrency
        )  # (without the cap the session's slots are the limit)
    finally:
        await origin.stop()


async def test_a_relayed_body_is_reported_as_it_arrives_not_as_its_part_completes(tmp_path: Path) -> None:
    """With ``on_written`` (a relay), bytes are reported as they arrive, also from a chunked answer of a mirror that
    ignores Range (which the splice cannot take: no length): reading it into a part-sized buffer reported nothing
    until the whole part was in, and the next node of a chain waited as long."""
    data = os.urandom(2 * FAST.part_size)
    origin = await origin_for(data)
    origin.ignore_range = origin.chunked = True
    origin.stall = asyncio.Event()  # every answer stops after its first chunk until released
    written: list[tuple[int, int]] = []
    try:
        fetch = asyncio.ensure_future(
            engine(replace(FAST, concurrency=1, write_buffer=FAST.part_size)).download(
                origin.url,
                tmp_path / "f",
                Expected(len(data), digests(data)),
                on_written=lambda a, b: written.append((a, b)),
            )
        )
        await until(lambda: sum(b - a for a, b in written) >= origin.chunk, "the first chunk reported")
        assert sum(b - a for a, b in written) < FAST.part_size  # (its part is not complete: the origin stalls)
        origin.stall.set()
        got = await asyncio.wait_for(fetch, 10)
    finally:
        await origin.stop()
    assert got.digests == digests(data) and sum(b - a for a, b in written) == len(data)


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
async def test_a_relayed_body_arriving_in_small_pieces_is_reported_in_steps(tmp_path: Path, chunked: bool) -> None:
    """A relay is told about the bytes in steps (``RELAY_STEP``, or what ``RELAY_LATENCY_S`` brings), not once per read:
    a body arriving a few KiB at a time, as over a capped link, was a write, a hash update and two wake-ups of the
    event loop per read. Every byte is still reported, once, in file order within each part."""
    data = os.urandom(1 * MiB)
    origin = await origin_for(data)
    origin.chunked = chunked
    origin.chunk = 4 * KiB
    origin.delay = 0.001
    written: list[tuple[int, int]] = []
    config = replace(FAST, concurrency=1, part_size=512 * KiB, write_buffer=512 * KiB)
    try:
        got = await asyncio.wait_for(
            engine(config).download(
                origin.url,
                tmp_path / "f",
                Expected(len(data), digests(data)),
                on_written=lambda a, b: written.append((a, b)),
            ),
            60,
        )
    finally:
        await origin.stop()
    assert got.digests == digests(data)
    covered = sorted(written)
    assert covered[0][0] == 0 and covered[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # every byte once, nothing skipped
    pieces = len(data) // origin.chunk  # 256 arrivals at least (reported one by one before)
    assert len(written) <= pieces // 2, len(written)


async def test_what_a_relayed_copy_gathered_is_kept_when_its_answer_breaks(tmp_path: Path) -> None:
    """Bytes gathered for a relay and not yet written when a read fails (here a chunk header that is not hex, with
    enough bytes on the socket that the read was not expected to wait) are written first: the retry asks for the
    rest, not for them again."""
    data = os.urandom(512 * KiB)
    first = 128 * KiB
    ranges: list[str | None] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        rng = next(
            (line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("range:")), None
        )
        ranges.append(rng)
        if len(ranges) == 1:  # a chunked answer that breaks after its first chunk
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n" % first + data[:first] + b"\r\n" + b"zz" * 64 + b"\r\n")
        else:
            start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
            body = data[start:]
            writer.write(
                b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n"
                b"Content-Range: bytes %d-%d/%d\r\n\r\n" % (len(body), start, len(data) - 1, len(data)) + body
            )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    written: list[tuple[int, int]] = []
    try:
        got = await asyncio.wait_for(
            engine(replace(FAST, part_size=len(data), write_buffer=len(data))).download(
                f"http://127.0.0.1:{port}/file",
                tmp_path / "f",
                Expected(len(data), digests(data)),
                on_written=lambda a, b: written.append((a, b)),
            ),
            30,
        )
    finally:
        server.close()
        await server.wait_closed()
    assert got.digests == digests(data)
    assert ranges[1] == f"bytes={first}-{len(data) - 1}"  # the first chunk was kept, not fetched again


async def _download_until_cancelled(
    dl: RangedDownloader, url: str, dest: Path, expected: Expected, fraction: float
) -> int:
    written = 0
    half = asyncio.Event()

    def on_bytes(n: int) -> None:
        nonlocal written
        written += n
        if written >= expected.size * fraction:
            half.set()

    task = asyncio.ensure_future(dl.download(url, dest, expected, on_bytes=on_bytes))
    waiter = asyncio.ensure_future(half.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    assert not task.done(), "the download finished before it could be cancelled"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return written


async def test_resume_after_cancel_refetches_at_most_the_parts_in_flight(tmp_path: Path) -> None:
    data = os.urandom(8 * MiB)
    cfg = RangedConfig(part_size=512 * KiB, concurrency=4, write_buffer=64 * KiB)
    origin = await origin_for(data)
    origin.delay = 0.004  # slow enough to be cancelled half-way
    dest = tmp_path / "f"
    state_path = Path(f"{dest}.parts.json")
    expected = Expected(len(data), digests(data), '"v1"')
    try:
        await _download_until_cancelled(engine(cfg), origin.url, dest, expected, 0.5)
        first_run = origin.bytes_sent

        # The map is valid JSON and every part it calls done holds the right bytes.
        part_size, done = done_parts(state_path)
        assert part_size == cfg.part_size
        assert 0 < len(done) < len(data) // part_size
        on_disk = dest.read_bytes()
        for i in done:
            assert on_disk[i * part_size : (i + 1) * part_size] == data[i * part_size : (i + 1) * part_size]

        origin.delay = 0
        got = await engine(cfg).download(origin.url, dest, expected)
    finally:
        await origin.stop()
    assert dest.read_bytes() == data
    assert got.resumed_bytes == len(done) * part_size
    refetched = origin.bytes_sent - len(data)  # both runs together, counted at the server
    assert first_run < len(data)
    assert 0 <= refetched <= cfg.concurrency * cfg.part_size


async def test_new_validator_discards_progress(tmp_path: Path) -> None:
    data = os.urandom(4 * MiB)
    cfg = RangedConfig(part_size=256 * KiB, concurrency=2, write_buffer=64 * KiB)
    origin = await origin_for(data)
    origin.delay = 0.003
    dest = tmp_path / "f"
    try:
        await _download_until_cancelled(engine(cfg), origin.url, dest, Expected(len(data), {}, '"v1"'), 0.4)
        origin.delay = 0
        origin.etag = '"v2"'  # the object was replaced
        got = await engine(cfg).download(origin.url, dest, Expected(len(data), digests(data), '"v2"'))
    finally:
        await origin.stop()
    assert got.resumed_bytes == 0 and got.fetched_bytes == len(data)
    assert dest.read_bytes() == data


async def test_disk_full_mid_download_keeps_the_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(3 * MiB)
    cfg = RangedConfig(part_size=256 * KiB, concurrency=1, write_buffer=64 * KiB)
    origin = await origin_for(data)
    dest = tmp_path / "f"
    real_pwrite, real_splice = job._pwrite_all, splice.write_from_pipe
    full_from = 5 * cfg.part_size  # the disk is full for every byte from part 5 on

    def filling(fd: int, view: memoryview, offset: int) -> None:
        if offset >= full_from:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_pwrite(fd, view, offset)

    def filling_splice(pipe_fd: int, fd: int, count: int, pos: int) -> int:
        if pos >= full_from:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_splice(pipe_fd, fd, count, pos)

    monkeypatch.setattr(job, "_pwrite_all", filling)
    monkeypatch.setattr(splice, "write_from_pipe", filling_splice)
    try:
        with pytest.raises(SourceError) as err:
            await engine(cfg).download(origin.url, dest, Expected(len(data), digests(data)))
        assert err.value.reason == "InsufficientDisk"
        _, done = done_parts(Path(f"{dest}.parts.json"))
        assert done == [0, 1, 2, 3, 4]
        monkeypatch.setattr(job, "_pwrite_all", real_pwrite)
        monkeypatch.setattr(splice, "write_from_pipe", real_splice)
        origin.bytes_sent = 0
        got = await engine(cfg).download(origin.url, dest, Expected(len(data), digests(data)))
    finally:
        await origin.stop()
    assert got.resumed_bytes == 5 * cfg.part_size
    assert origin.bytes_sent == len(data) - 5 * cfg.part_size
    assert dest.read_bytes() == data


# ----------------------------------------------------------------------------------------------- capacity


def _usage(free: int, size: int = 1000 * MiB, device: int = 1) -> Any:
    return lambda _path: DiskUsage(device=device, size=size, free=free)


def test_reserve_counts_other_downloads_and_the_margin(tmp_path: Path) -> None:
    reg = CapacityRegistry(DiskReserve(fraction=0.10), usage=_usage(free=500 * MiB))
    first = reg.reserve(tmp_path, 300 * MiB, "model a")
    assert reg.reserved(tmp_path) == 300 * MiB
    with pytest.raises(SourceError) as err:
        reg.reserve(tmp_path, 150 * MiB, "model b")  # 500 - 300 - 150 = 50 < 100 (10 % of 1000)
    assert err.value.reason == "InsufficientDisk" and "model b" in err.value.message
    second = reg.reserve(tmp_path, 100 * MiB, "model b")  # 500 - 300 - 100 = 100: exactly the margin
    first.consume(300 * MiB)  # preallocated: now counted by the free space itself
    assert reg.reserved(tmp_path) == 100 * MiB
    first.release()
    second.release()
    second.release()
    assert reg.reserved(tmp_path) == 0


def test_disk_reserve_parsing() -> None:
    assert DiskReserve.parse("10%") == DiskReserve(fraction=0.10)
    assert DiskReserve.parse("0") == DiskReserve(absolute=0)
    assert DiskReserve.parse("50GiB").bytes_for(10**15) == 50 * 1024**3
    assert DiskReserve.parse("20G").bytes_for(10**15) == 20 * 10**9
    assert DiskReserve().bytes_for(1000) == 100
    for bad in ("ten", "120%", "5 parsecs"):
        with pytest.raises(ValueError):
            DiskReserve.parse(bad)


async def test_preallocation_consumes_the_reservation(tmp_path: Path) -> None:
    data = os.urandom(1 * MiB)
    origin = await origin_for(data)
    reg = CapacityRegistry(DiskReserve(absolute=0))
    try:
        with reg.reserve(tmp_path, len(data), "m") as reservation:
            await engine(FAST).download(origin.url, tmp_path / "f", Expected(len(data)), reservation=reservation)
            assert reservation.remaining < len(data)  # the file's blocks are allocated now
    finally:
        await origin.stop()
    assert reg.reserved(tmp_path) == 0


_CHILD = """
import asyncio, sys
from pathlib import Path
from model_agent.transfer import Expected, RangedConfig, RangedDownloader

async def main() -> None:
    url, dest, size, part, conc = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    written = 0
    def on_bytes(n: int) -> None:
        nonlocal written
        written += n
        print(written, flush=True)
    async with RangedDownloader(config=RangedConfig(part_size=part, concurrency=conc)) as dl:
        await dl.download(url, dest, Expected(size, {}, '"v1"'), on_bytes=on_bytes)

asyncio.run(main())
"""


@pytest.mark.parametrize("part", [256 * KiB, 1 * MiB])
async def test_sigkill_at_half_refetches_at_most_concurrency_parts(tmp_path: Path, part: int) -> None:
    data = os.urandom(16 * MiB)
    conc = 4
    origin = await origin_for(data)
    origin.delay = 0.002
    dest = tmp_path / "f"
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CHILD,
            origin.url,
            str(dest),
            str(len(data)),
            str(part),
            str(conc),
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert child.stdout is not None
        while True:
            line = await asyncio.wait_for(child.stdout.readline(), 30)
            assert line, "the child ended before it was killed"
            if int(line) >= len(data) // 2:
                break
        child.kill()
        await child.wait()
        first_run = origin.bytes_sent
        origin.delay = 0
        got = await engine(RangedConfig(part_size=part, concurrency=conc)).download(
            origin.url, dest, Expected(len(data), digests(data), '"v1"')
        )
    finally:
        await origin.stop()
    assert dest.read_bytes() == data
    assert got.digests == digests(data)
    assert got.resumed_bytes > 0 and first_run < len(data)
    # The restart fetched exactly what the map did not record, nothing more.
    assert origin.bytes_sent - first_run == len(data) - got.resumed_bytes
    # A slot is released only once its part is recorded, so at the kill at most `conc` parts were in flight or
    # completed but unrecorded: counted at the server, what was sent twice is at most conc x part.
    assert origin.bytes_sent - len(data) <= conc * part


async def test_cancel_is_prompt_while_the_server_stalls(tmp_path: Path) -> None:
    data = os.urandom(2 * MiB)
    origin = await origin_for(data)
    origin.stall = asyncio.Event()  # one chunk, then nothing: every worker thread blocks on its socket
    cfg = RangedConfig(part_size=512 * KiB, concurrency=4, write_buffer=256 * KiB, read_timeout_s=3600)
    try:
        task = asyncio.ensure_future(engine(cfg).download(origin.url, tmp_path / "f", Expected(len(data))))

        async def all_slots_waiting() -> bool:
            return len(origin.ranges) == cfg.concurrency

        await eventually(all_slots_waiting, timeout=10, what="every slot waiting on the stalled server")
        task.cancel()
        # The threads are woken by shutting their sockets down, not by the (hour-long) read timeout.
        done, _ = await asyncio.wait([task], timeout=10)
        assert done, "the download did not stop after cancellation"
        assert task.cancelled()
    finally:
        await origin.stop()


async def test_headers_callable_is_called_per_request_with_its_url(tmp_path: Path) -> None:
    data = os.urandom(1 * MiB)
    origin = await origin_for(data)
    seen: list[str] = []

    def sign(url: str) -> dict[str, str]:
        seen.append(url)
        return {"X-Signature": f"sig-{len(seen)}"}

    try:
        await engine(FAST).download(origin.url, tmp_path / "f", Expected(len(data), digests(data)), headers=sign)
    finally:
        await origin.stop()
    parts = len(data) // FAST.part_size
    assert seen == [origin.url] * parts
    assert sorted(origin.signatures) == sorted(f"sig-{n}" for n in range(1, parts + 1))


async def test_url_callable_is_renewed_per_request(tmp_path: Path) -> None:
    data = os.urandom(1 * MiB)
    origin = await origin_for(data)
    calls = 0

    async def presign() -> str:
        nonlocal calls
        calls += 1
        return f"{origin.url}?X-Amz-Signature={calls}"

    try:
        got = await engine(FAST).download(presign, tmp_path / "f", Expected(len(data), digests(data)))
    finally:
        await origin.stop()
    assert calls == got.requests == len(data) // FAST.part_size
    assert (tmp_path / "f").read_bytes() == data


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ranged test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def test_https_verifies_against_the_given_ca_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    data = os.urandom(1 * MiB + 5)
    origin = Origin(data)
    await origin.start(tls)
    assert origin.url.startswith("https://")
    try:
        # Not trusted by the system roots: refused at once (not retried), with a reason that says why.
        with pytest.raises(SourceError) as err:
            await engine(FAST).download(origin.url, tmp_path / "a", Expected(len(data)))
        assert err.value.reason == "TLSError"
        assert origin.ranges == []
        with pytest.raises(SourceError) as err:
            await engine(replace(FAST, ca_bundle=str(tmp_path / "missing.pem"))).download(
                origin.url, tmp_path / "a", Expected(len(data))
            )
        assert err.value.reason == "TLSError" and "CA certificates" in err.value.message
        # Trusted through the configuration, and through AWS_CA_BUNDLE.
        got = await engine(replace(FAST, ca_bundle=str(cert))).download(
            origin.url, tmp_path / "b", Expected(len(data), digests(data))
        )
        assert got.digests == digests(data)
        monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
        await engine(FAST).download(origin.url, tmp_path / "c", Expected(len(data), digests(data)))
    finally:
        await origin.stop()
    assert (tmp_path / "c").read_bytes() == data


async def test_http_proxy_from_the_environment_is_used_and_no_proxy_bypasses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(600 * KiB)
    proxy = await origin_for(data)  # answers absolute-form requests for any host, like a forward proxy
    origin = await origin_for(data)
    monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/file"))
    monkeypatch.setenv("NO_PROXY", "localhost")
    try:
        # Only the proxy can answer for this name (.invalid never resolves).
        await engine(FAST).download("http://model-store.invalid/file", tmp_path / "a", Expected(len(data)))
        assert len(proxy.ranges) == 3 and proxy.targets[0] == "http://model-store.invalid/file"
        assert proxy.hosts[0] == "model-store.invalid"
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        await engine(FAST).download(origin.url, tmp_path / "b", Expected(len(data), digests(data)))
    finally:
        await proxy.stop()
        await origin.stop()
    assert len(proxy.ranges) == 3 and len(origin.ranges) == 3
    assert (tmp_path / "a").read_bytes() == data


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypassed"),
    [
        ("10.1.2.3", 8090, "10.0.0.0/8", True),  # a CIDR range (Python's proxy_bypass ignores it)
        ("10.1.2.3", 8090, "192.168.0.0/16,10.0.0.0/8", True),
        ("11.1.2.3", 8090, "10.0.0.0/8", False),
        ("fd00::5", 8090, "fd00::/8", True),
        ("[fd00::5]", 8090, "fd00::/8", True),
        ("10.1.2.3", 8090, "10.1.2.3", True),
        ("10.1.2.3", 8090, "10.1.2.3:9000", False),  # another port
        ("hub.example.org", 443, ".example.org", True),
        ("hub.example.org", 443, "example.org", True),
        ("hub.example.org", 443, "*.example.org", True),
        ("badexample.org", 443, "example.org", False),
        ("hub.example.org", 443, "*", True),
        ("hub.example.org", 443, "", False),
        ("10.1.2.3", 8090, "not-a-range/99", False),
    ],
)
def test_no_proxy_reads_cidr_ranges_domains_and_ports(host: str, port: int, no_proxy: str, bypassed: bool) -> None:
    assert no_proxy_matches(host, port, no_proxy) is bypassed


async def test_a_peer_session_never_uses_the_environment_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy set for everything (NO_PROXY empty) is not used with ``use_proxy=False``: the peer token never goes
    through it."""
    data = os.urandom(600 * KiB)
    proxy = await origin_for(data)
    origin = await origin_for(data)
    monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/file"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        direct = replace(FAST, use_proxy=False)
        await engine(direct).download(origin.url, tmp_path / "p", Expected(len(data), digests(data)))
    finally:
        await proxy.stop()
        await origin.stop()
    assert proxy.ranges == [] and len(origin.ranges) == 3


async def test_an_engine_session_reads_the_proxy_environment_once_per_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(600 * KiB)
    origin = await origin_for(data)
    looked: list[int] = []
    real = urllib.request.getproxies_environment

    def counted() -> dict[str, str]:
        looked.append(1)
        return real()

    monkeypatch.setattr(urllib.request, "getproxies_environment", counted)
    try:
        session = engine(FAST)
        for name in ("a", "b", "c"):  # 3 parts each, on up to 4 slots: 9 requests
            await session.download(origin.url, tmp_path / name, Expected(len(data), digests(data)))
        assert len(origin.ranges) == 9 and len(looked) == 1
        await engine(FAST).download(origin.url, tmp_path / "d", Expected(len(data)))  # a new session looks again
        assert len(looked) == 2
    finally:
        await origin.stop()
