"""The peer server: authenticated, content-addressed, ranged, confined, rate- and concurrency-capped."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from model_agent.local.manifest import FileRecord, Manifest
from model_agent.peers.auth import TokenReviewer
from model_agent.peers.server import BlobIndex, PeerServer, UploadPacer, parse_range

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
            return {"status": {"authenticated": True, "user": {"username": AGENT}, "audiences": ["model-agent-peer"]}}
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
        BlobIndex(lambda: list(manifests), lambda: [tmp_path / "models"], index_s=0.0),
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


async def _get(server: PeerServer, digest: str, token: str | None, **headers: str) -> tuple[int, bytes, Any]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{server.port}/blobs/sha256/{digest}", headers=headers) as r,
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
