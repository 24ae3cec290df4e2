"""The peer server: authenticated, content-addressed, ranged, confined, rate- and concurrency-capped."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from model_agent.local.manifest import FileRecord, Manifest
from model_agent.peers.auth import TokenReviewer
from model_agent.peers.relay import FROM_HEADER, PATH_HEADER, WAIT_HEADER, Relay, Relays
from model_agent.peers.server import (
    MAX_FEED_WAIT_S,
    SO_MAX_PACING_RATE,
    BlobIndex,
    PeerServer,
    UploadPacer,
    feed_wait,
    parse_range,
)
from model_agent.transfer.partmap import PartMap
from tests.support.waiting import eventually
from tests.unit.test_hf_source import git_sha1

AGENT = "system:serviceaccount:ns:model-agent"


class FakeApi:
    """Answers TokenReviews: token "good" is the agent for the audience, "other" someone else, "noaud" not for it."""

    def __init__(self) -> None:
        self.reviews = 0

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        assert method == "POST" and path.endswith("/tokenreviews")
        self.reviews += 1
        token = kw["body"]["spec"]["token"]
        assert kw["body"]["spec"]["audiences"] == ["model-agent-peer"]
        if token == "good":
            user = {"username": AGENT, "extra": {"authentication.kubernetes.io/node-name": ["peer-node"]}}
            return {"status": {"authenticated": True, "user": user, "audiences": ["model-agent-peer"]}}
        if token == "other":
            return {"status": {"authenticated": True, "user": {"username": "system:serviceaccount:ns:x"}}}
        return {"status": {"authenticated": False, "error": "invalid audience"}}


def _model(tmp_path: Path, content: bytes, name: str = "w.bin") -> tuple[Manifest, str]:
    dest = tmp_path / "models" / "m"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / name).write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    record = FileRecord(name, len(content), digest, None, (dest / name).stat().st_mtime_ns)
    return Manifest(key="k", uid="u", storage_uri="hf://o/m", dest=str(dest), files=[record]), digest


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[PeerServer, list[Manifest], FakeApi]]:
    manifests: list[Manifest] = []
    api = FakeApi()
    server = PeerServer(
        # small files by blob id only from copies of this test's trusted key ("k"; the agent's rule: sources.egress)
        BlobIndex(
            lambda: list(manifests), lambda: [tmp_path / "models"], index_s=0.0, by_blob_id=lambda m: m.key == "k"
        ),
        TokenReviewer(api, "model-agent-peer", AGENT),  # type: ignore[arg-type]
        host="127.0.0.1",
        port=0,
        max_per_peer=2,
    )
    await server.start()
    try:
        yield server, manifests, api
    finally:
        await server.stop()


async def _get(
    server: PeerServer, digest: str, token: str | None, *, algorithm: str = "sha256", **headers: str
) -> tuple[int, bytes, Any]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{server.port}/blobs/{algorithm}/{digest}", headers=headers) as r,
    ):
        return r.status, await r.read(), r.headers


async def test_serves_a_ready_file_whole_and_by_range(tmp_path: Path, served: Any) -> None:
    server, manifests, _ = served
    content = os.urandom(3 * 1024 * 1024 + 5)
    manifest, digest = _model(tmp_path, content)
    manifests.append(manifest)
    status, body, _ = await _get(server, digest, "good")
    assert status == 200 and body == content
    status, body, headers = await _get(server, digest, "good", Range="bytes=10-19")
    assert status == 206 and body == content[10:20]
    assert headers["Content-Range"] == f"bytes 10-19/{len(content)}"
    status, body, _ = await _get(server, digest, "good", Range="bytes=-7")
    assert status == 206 and body == content[-7:]
    status, _, headers = await _get(server, digest, "good", Range=f"bytes={len(content)}-")
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(content)}"
    assert server.uploaded == len(content) + 10 + 7


async def test_a_small_file_is_served_by_its_git_blob_id_too(tmp_path: Path, served: Any) -> None:
    # A hub lists only the git blob id of a small file: peers ask for it by that id, under its own route.
    server, manifests, _ = served
    content = b'{"architectures": ["LlamaForCausalLM"]}'
    manifest, sha256 = _model(tmp_path, content, "config.json")
    oid = git_sha1(content)
    manifest.files[0] = dataclasses.replace(manifest.files[0], git_sha1=oid)
    manifests.append(manifest)
    assert (await _get(server, oid, "good", algorithm="git-sha1"))[:2] == (200, content)
    assert (await _get(server, sha256, "good"))[:2] == (200, content)
    # a digest is served only under the route of its own algorithm, in lower-case hex
    for algorithm, digest in (("sha256", oid), ("git-sha1", sha256), ("sha1", oid), ("git-sha1", oid.upper())):
        status, body, _ = await _get(server, digest, "good", algorithm=algorithm)
        assert status == 404 and body != content, (algorithm, digest)
    # a copy the index does not accept for blob ids (a tenant's): by its sha256 only
    other = b'{"architectures": ["MistralForCausalLM"]}'
    (tmp_path / "models" / "t").mkdir()
    (tmp_path / "models" / "t" / "config.json").write_bytes(other)
    other_sha256 = hashlib.sha256(other).hexdigest()
    mtime = (tmp_path / "models" / "t" / "config.json").stat().st_mtime_ns
    record = FileRecord("config.json", len(other), other_sha256, git_sha1(other), mtime)
    dest = str(tmp_path / "models" / "t")
    manifests.append(Manifest(key="BaseModel/team-a/t", uid="u2", storage_uri="hf://o/t", dest=dest, files=[record]))
    assert (await _get(server, git_sha1(other), "good", algorithm="git-sha1"))[0] == 404
    assert (await _get(server, other_sha256, "good"))[:2] == (200, other)


async def test_refuses_missing_and_wrong_tokens_and_caches_reviews(tmp_path: Path, served: Any) -> None:
    server, manifests, api = served
    manifest, digest = _model(tmp_path, b"weights")
    manifests.append(manifest)
    assert (await _get(server, digest, None))[0] == 401
    assert (await _get(server, digest, "noaud"))[0] == 403
    assert (await _get(server, digest, "other"))[0] == 403
    assert (await _get(server, digest, "good"))[0] == 200
    reviews = api.reviews
    assert (await _get(server, digest, "good"))[0] == 200
    assert (await _get(server, digest, "noaud"))[0] == 403
    assert api.reviews == reviews  # both answers came from the cache


async def test_serves_only_recorded_unchanged_files_inside_the_roots(tmp_path: Path, served: Any) -> None:
    server, manifests, _ = served
    assert (await _get(server, "0" * 64, "good"))[0] == 404  # nobody recorded it
    assert (await _get(server, "not-a-digest", "good"))[0] == 404
    manifest, digest = _model(tmp_path, b"original")
    manifests.append(manifest)
    path = Path(manifest.dest) / "w.bin"
    path.write_bytes(b"changed!")  # same size, new mtime: not what the manifest recorded
    os.utime(path, ns=(time.time_ns(), manifest.files[0].mtime_ns + 10**9))
    assert (await _get(server, digest, "good"))[0] == 404
    # a symlink in place of the recorded file is never followed, even to a file with the right bytes
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"original")
    path.unlink()
    path.symlink_to(outside)
    assert (await _get(server, digest, "good"))[0] == 404
    # a manifest whose removal was decided is not served
    other, other_digest = _model(tmp_path, b"leaving", "x.bin")
    other.removing = "deleted"
    manifests.append(other)
    assert (await _get(server, other_digest, "good"))[0] == 404


async def test_a_peer_over_its_limit_gets_429(tmp_path: Path, served: Any) -> None:
    server, manifests, _ = served
    manifest, digest = _model(tmp_path, os.urandom(8 * 1024 * 1024))
    manifests.append(manifest)
    server.pacer = UploadPacer(4 * 1024 * 1024)  # slow enough that two answers are still in flight
    results = await asyncio.gather(*(_get(server, digest, "good") for _ in range(3)))
    assert sorted(r[0] for r in results) == [200, 200, 429]


async def test_answers_sockets_are_paced_by_the_kernel_at_their_share(
    tmp_path: Path, served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two answers at once each get half the cap on their socket (read back from the kernel), so neither sends a
    burst; one alone gets the whole cap."""
    server, manifests, _ = served
    rate = 4 * 1024 * 1024
    # 8 MiB each at 4 MiB/s (the bucket holds one second's worth): the two answers overlap for about 2 s
    one, first = _model(tmp_path, os.urandom(8 * 1024 * 1024), "a.bin")
    two, second = _model(tmp_path, os.urandom(8 * 1024 * 1024), "b.bin")
    manifests += [one, two]
    server.pacer = UploadPacer(rate)
    kernel_says: list[int] = []
    pace = UploadPacer.pace

    def recorded(sock: Any, value: int) -> bool:
        done = pace(sock, value)
        if done:
            kernel_says.append(sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE))
        return done

    monkeypatch.setattr(UploadPacer, "pace", staticmethod(recorded))
    alone = await _get(server, first, "good")
    assert alone[0] == 200 and kernel_says == [rate], kernel_says
    kernel_says.clear()
    both = await asyncio.gather(_get(server, first, "good"), _get(server, second, "good"))
    assert [r[0] for r in both] == [200, 200]
    assert kernel_says.count(rate // 2) >= 2, kernel_says  # each socket at half while both send


async def _read_some_then_reset(port: int, digest: str, some: int) -> int:
    """A raw client that asks for a blob, reads ``some`` bytes of the answer and resets the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /blobs/sha256/{digest} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good\r\n\r\n".encode())
    got = 0
    while got < some:
        data = await reader.read(64 * 1024)
        assert data, "the server closed first"
        got += len(data)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    writer.close()
    return got


async def test_a_client_gone_mid_answer_ends_it_short_without_an_error(
    tmp_path: Path, served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A downstream that leaves mid-body (it found the bytes elsewhere, or was killed) ends the answer: sent as
    a 200 that stopped short, counted only for what went out, no error logged; the server answers the next one."""
    server, manifests, _ = served
    content = os.urandom(8 * 1024 * 1024)
    manifest, digest = _model(tmp_path, content)
    manifests.append(manifest)
    answers: list[tuple[str, int]] = []
    server.on_answer = lambda method, code: answers.append((method, code))
    server.pacer = UploadPacer(1024 * 1024)  # 8 s for the whole file: the client leaves well before the end
    await _read_some_then_reset(server.port, digest, 256 * 1024)

    async def answered() -> bool:
        return bool(answers)

    await eventually(answered, timeout=10, what="the answer to end")
    assert answers == [("GET", 200)]
    assert 0 < server.uploaded < len(content)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
    server.pacer = UploadPacer(0)
    status, body, _ = await _get(server, digest, "good", Range="bytes=0-9")
    assert status == 206 and body == content[:10]


async def test_a_file_system_without_sendfile_is_served_by_reads_and_writes(
    tmp_path: Path, served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``sendfile(2)`` refuses the file (as on a file system that does not implement it), every answer is
    still whole and exact, whole or by range, sent by reads and writes instead."""
    server, manifests, _ = served
    content = os.urandom(3 * 1024 * 1024 + 11)
    manifest, digest = _model(tmp_path, content)
    manifests.append(manifest)
    refused: list[int] = []

    def no_sendfile(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        refused.append(count)
        raise OSError(errno.EINVAL, "sendfile not supported here")

    monkeypatch.setattr(os, "sendfile", no_sendfile)
    status, body, _ = await _get(server, digest, "good")
    assert status == 200 and body == content
    status, body, _ = await _get(server, digest, "good", Range="bytes=1048570-2097160")
    assert status == 206 and body == content[1048570:2097161]
    assert refused  # (the native path was tried, and refused)
    assert server.uploaded == len(content) + 2097161 - 1048570


async def test_a_file_cut_short_while_sent_ends_the_answer_short(tmp_path: Path, served: Any) -> None:
    """A Ready file truncated on disk while its answer is sent: the answer stops where the file ends and the
    connection closes, so the client sees a short body (and its verification would refuse it), never a hang."""
    server, manifests, _ = served
    content = os.urandom(4 * 1024 * 1024)
    manifest, digest = _model(tmp_path, content)
    manifests.append(manifest)
    server.pacer = UploadPacer(1024 * 1024)
    path = Path(manifest.dest) / "w.bin"
    got = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with (
            aiohttp.ClientSession() as s,
            s.get(
                f"http://127.0.0.1:{server.port}/blobs/sha256/{digest}", headers={"Authorization": "Bearer good"}
            ) as r,
        ):
            assert r.status == 200
            got += await r.content.readexactly(64 * 1024)
            os.truncate(path, 1536 * 1024)
            got += await r.content.read()
    assert len(got) < len(content) and content.startswith(got)


async def test_upload_pacer_holds_the_rate() -> None:
    pacer = UploadPacer(4_000_000)
    started = time.monotonic()
    for _ in range(4):
        await pacer.take(2_000_000)
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 2.5  # 8 MB at 4 MB/s with a 4 MB burst: about 1 s


def test_parse_range() -> None:
    assert parse_range(None, 10) is None
    assert parse_range("bytes=0-4", 10) == (0, 5)
    assert parse_range("bytes=5-", 10) == (5, 10)
    assert parse_range("bytes=-3", 10) == (7, 10)
    assert parse_range("bytes=8-100", 10) == (8, 10)
    assert parse_range("bytes=10-", 10) == "unsatisfiable"
    assert parse_range("bytes=0-1,4-5", 10) is None


# ---------------------------------------------------------------- files being fetched (peers.relay)

PART = 64 * 1024


@pytest.fixture
async def relaying(tmp_path: Path) -> AsyncIterator[tuple[PeerServer, Relays, Path]]:
    """A server with no Ready file and a relay registry; its models root is ``tmp_path / "models"``."""
    relays = Relays()
    server = PeerServer(
        BlobIndex(lambda: [], lambda: [tmp_path / "models"], index_s=0.0),
        TokenReviewer(FakeApi(), "model-agent-peer", AGENT),  # type: ignore[arg-type]
        host="127.0.0.1",
        port=0,
        relays=relays,
        relay_poll_s=0.005,
        relay_wait_s=0.3,
    )
    await server.start()
    try:
        yield server, relays, tmp_path / "models" / ".model-agent" / "staging" / "m"
    finally:
        await server.stop()


def _being_fetched(staging: Path, content: bytes, done: list[int]) -> tuple[str, Path, Path]:
    """A staged file holding all of ``content`` on disk, whose part map records only the parts ``done``."""
    staging.mkdir(parents=True, exist_ok=True)
    path, state_path = staging / "w.bin", staging / "w.bin.parts.json"
    path.write_bytes(content)
    _record(state_path, len(content), done)
    return hashlib.sha256(content).hexdigest(), path, state_path


def _record(state_path: Path, size: int, done: list[int], *, complete: bool = False) -> None:
    state = PartMap.fresh(size, PART, None)
    for i in done:
        state.mark(i)
    state.complete = complete
    state.save(state_path)


async def _get_short(server: PeerServer, digest: str) -> tuple[int, bytes, Any]:
    """A GET whose answer may end short (the connection closed): what arrived."""
    got = b""
    async with (
        aiohttp.ClientSession() as s,
        s.get(_url(server, digest), headers={"Authorization": "Bearer good"}) as r,
    ):
        with contextlib.suppress(aiohttp.ClientPayloadError):
            while chunk := await r.content.readany():
                got += chunk
        return r.status, got, r.headers


def _url(server: PeerServer, digest: str) -> str:
    return f"http://127.0.0.1:{server.port}/blobs/sha256/{digest}"


async def test_a_file_being_fetched_is_served_only_by_its_durable_parts(relaying: Any) -> None:
    server, relays, staging = relaying
    content = os.urandom(3 * PART + 100)
    digest, path, state_path = _being_fetched(staging, content, [0])  # every byte written, one part recorded
    with relays.scope() as scope:
        relay = scope.start(digest, len(content), path, state_path)
        assert (await _get(server, digest, "good"))[0] == 404  # no source yet: nobody waits on it
        relays.fed_by(relay, ("10.0.0.9:1",))
        status, body, headers = await _get_short(server, digest)
    # the answer waited for part 1, saw no new durable byte within relay_wait_s, and ended short
    assert status == 200 and body == content[:PART]
    assert headers[PATH_HEADER] == "10.0.0.9:1"
    assert server.uploaded == PART


async def test_an_answer_streams_on_as_parts_become_durable(relaying: Any) -> None:
    server, relays, staging = relaying
    server.relay_wait_s = 30.0
    content = os.urandom(3 * PART + 100)
    digest, path, state_path = _being_fetched(staging, content, [0])
    with relays.scope() as scope:
        relays.fed_by(scope.start(digest, len(content), path, state_path), ())
        async with (
            aiohttp.ClientSession() as s,
            s.get(_url(server, digest), headers={"Authorization": "Bearer good", "Range": "bytes=10-"}) as r,
        ):
            assert r.status == 206
            got = await r.content.readexactly(PART - 10)
            _record(state_path, len(content), [0, 1])  # the next part recorded while the answer waits
            got += await r.content.readexactly(PART)
            _record(state_path, len(content), [0, 1, 2, 3], complete=True)
            got += await r.content.read()
    assert got == content[10:]


async def test_bytes_written_in_small_pieces_are_sent_in_batches(relaying: Any) -> None:
    """A relayed file written 4 KiB at a time is sent in pieces of at least RELAY_BATCH (or what 50 ms brought),
    not one send per write: each send costs a pacer round, a read and a write."""
    server, relays, staging = relaying
    server.relay_wait_s = 30.0
    content = os.urandom(4 * PART)
    digest, path, state_path = _being_fetched(staging, content, [])
    sends: list[int] = []
    server.on_upload = sends.append
    with relays.scope() as scope:
        relay = scope.start(digest, len(content), path, state_path)
        relays.fed_by(relay, ())
        write = relay.writer()

        async def writer() -> None:
            for at in range(0, len(content), 4096):
                write(at, at + 4096)
                await asyncio.sleep(0.001)

        writing = asyncio.ensure_future(writer())
        status, got, _ = await asyncio.wait_for(_get_short(server, digest), 30)
        await writing
    assert status == 200 and got == content
    writes = len(content) // 4096
    assert len(sends) <= writes // 2, (len(sends), writes)  # (64 writes: 62-64 sends before)


async def test_a_failed_file_is_not_served_one_more_byte(relaying: Any) -> None:
    server, relays, staging = relaying
    server.relay_wait_s = 30.0
    content = os.urandom(3 * PART)
    digest, path, state_path = _being_fetched(staging, content, [0])
    with relays.scope() as scope:
        relay = scope.start(digest, len(content), path, state_path)
        relays.fed_by(relay, ())
        async with (
            aiohttp.ClientSession() as s,
            s.get(_url(server, digest), headers={"Authorization": "Bearer good"}) as r,
        ):
            got = await r.content.readexactly(PART)
            relays.failed(relay)  # e.g. its bytes did not verify: the engine deletes it
            _record(state_path, len(content), [0, 1, 2], complete=True)
            with contextlib.suppress(aiohttp.ClientPayloadError):
                while chunk := await r.content.readany():
                    got += chunk
    assert got == content[:PART]
    assert (await _get(server, digest, "good"))[0] == 404


async def test_one_downstream_node_per_file(relaying: Any) -> None:
    server, relays, staging = relaying
    content = os.urandom(2 * PART)
    digest, path, state_path = _being_fetched(staging, content, [0, 1])
    with relays.scope() as scope:
        relays.fed_by(scope.start(digest, len(content), path, state_path), ("10.0.0.9:1", "10.0.0.8:1"))
        headers = {"Authorization": "Bearer good"}
        async with aiohttp.ClientSession() as s:
            async with s.head(_url(server, digest), headers={**headers, FROM_HEADER: "a:1"}) as r:
                assert r.status == 200 and r.headers[PATH_HEADER] == "10.0.0.9:1,10.0.0.8:1"
            async with s.head(_url(server, digest), headers={**headers, FROM_HEADER: "b:1"}) as r:
                assert r.status == 429  # a:1 probed it: its place, kept for its requests to come
            async with s.get(_url(server, digest), headers={**headers, FROM_HEADER: "a:1"}) as r:
                assert r.status == 200 and await r.read() == content
    assert server.downstreams.holders(digest) == ["a:1"] and server.downstreams.refused == 1


async def test_a_probe_asking_to_wait_is_held_until_the_file_has_a_source(relaying: Any) -> None:
    server, relays, staging = relaying
    content = os.urandom(2 * PART)
    digest, path, state_path = _being_fetched(staging, content, [0, 1])
    headers = {"Authorization": "Bearer good", FROM_HEADER: "a:1"}
    with relays.scope() as scope:
        relay = scope.start(digest, len(content), path, state_path)  # being fetched here, no source yet
        async with aiohttp.ClientSession() as s:
            async with s.head(_url(server, digest), headers=headers) as r:
                assert r.status == 404  # no wait asked: answered at once
            assert server.downstreams.holders(digest) == []

            async def probe() -> tuple[int, str]:
                async with s.head(_url(server, digest), headers={**headers, WAIT_HEADER: "30"}) as r:
                    return r.status, r.headers.get(PATH_HEADER, "")

            held = asyncio.ensure_future(probe())
            await eventually(lambda: _has_waiter(relay), what="the probe held by the server")
            assert not held.done()
            relays.fed_by(relay, ("10.0.0.9:1",))
            async with asyncio.timeout(5):  # (the server holds a probe MAX_FEED_WAIT_S at most: the feed answered it)
                assert await held == (200, "10.0.0.9:1")
    assert server.downstreams.holders(digest) == ["a:1"]


async def test_a_held_probe_ends_with_404_at_most_after_the_servers_cap(relaying: Any) -> None:
    server, relays, staging = relaying
    content = os.urandom(PART)
    digest, path, state_path = _being_fetched(staging, content, [0])
    headers = {"Authorization": "Bearer good", WAIT_HEADER: "3600"}
    with relays.scope() as scope:
        scope.start(digest, len(content), path, state_path)  # never fed
        async with aiohttp.ClientSession() as s:
            async with asyncio.timeout(MAX_FEED_WAIT_S + 5), s.head(_url(server, digest), headers=headers) as r:
                assert r.status == 404
            async with s.head(_url(server, "f" * 64), headers=headers) as r:
                assert r.status == 404  # not fetched here: nothing to wait for


async def _has_waiter(relay: Relay) -> bool:
    return relay._changed is not None


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        (None, 0.0),
        ("", 0.0),
        ("0.5", 0.5),
        ("1", 1.0),
        ("-1", 0.0),
        ("nan", 0.0),
        ("inf", MAX_FEED_WAIT_S),
        ("3600", MAX_FEED_WAIT_S),
        ("soon", 0.0),
    ],
)
def test_feed_wait(header: str | None, wait: float) -> None:
    assert feed_wait(header) == wait


async def test_a_file_being_fetched_outside_the_roots_is_not_served(tmp_path: Path, relaying: Any) -> None:
    server, relays, _ = relaying
    content = os.urandom(PART)
    digest, path, state_path = _being_fetched(tmp_path / "elsewhere", content, [0])
    with relays.scope() as scope:
        relays.fed_by(scope.start(digest, len(content), path, state_path), ())
        assert (await _get(server, digest, "good"))[0] == 404
