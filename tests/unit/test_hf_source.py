"""The ``hf://`` source's data paths against a fake hub and a fake CDN on loopback.

Fakes, named as such: the real Hugging Face Hub cannot run here, and the real mirror the e2e tests use (olah)
answers ``Range`` with the whole file and never redirects, so it cannot show what matters here - that weights
move as parallel ranged GETs from where the hub redirects to, and that the token is never sent there.
``FakeHub`` serves the three routes huggingface_hub uses (revision, tree, resolve); ``FakeCdn`` serves blobs
by sha256 with ``Range``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from model_agent.local.manifest import FileRecord
from model_agent.sources import hf as hf_module
from model_agent.sources.base import FetchRequest, SourceError
from model_agent.sources.hf import HuggingFaceSource
from model_agent.transfer import RangedConfig

KiB = 1024
COMMIT = "c0ffee" * 6 + "abcd"
REPO = "acme/tiny"
TOKEN = "hf_secret_token"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class Fakes:
    hub_url: str
    cdn_url: str
    hub: list[Seen] = field(default_factory=list)
    cdn: list[Seen] = field(default_factory=list)
    flip: str = ""  # the CDN flips one byte of the blob with this sha256
    flip_small: str = ""  # the hub flips one byte of this small file


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[Fakes, dict[str, bytes]]]:
    files = {
        "adapter.safetensors": b"\x03" * (64 * KiB),  # listed first, smallest: fetched last
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(),
        "model.safetensors": bytes(range(256)) * (4 * KiB),  # 1 MiB: LFS, fetched in ranges
        "shards/part-2.safetensors": b"\x01\x02" * (100 * KiB),
        "moved_small.txt": b"a git blob the hub serves from elsewhere\n",  # its resolve URL redirects
    }
    lfs = {p for p in files if p.endswith(".safetensors")}
    blobs = {hashlib.sha256(files[p]).hexdigest(): files[p] for p in lfs}
    state = Fakes("", "")

    def seen(request: web.Request) -> Seen:
        return Seen(request.method, request.path, request.headers.get("Range"), request.headers.get("Authorization"))

    async def revision(request: web.Request) -> web.Response:
        state.hub.append(seen(request))
        return web.json_response({"id": REPO, "modelId": REPO, "sha": COMMIT, "siblings": []})

    async def tree(request: web.Request) -> web.Response:
        state.hub.append(seen(request))
        entries = []
        for path, data in files.items():
            entry: dict[str, object] = {"type": "file", "path": path, "size": len(data), "oid": git_sha1(data)}
            if path in lfs:
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return web.json_response(entries)

    async def resolve(request: web.Request) -> web.StreamResponse:
        state.hub.append(seen(request))
        path = request.match_info["path"]
        data = files[path]
        headers = {"X-Repo-Commit": COMMIT}
        if path in lfs:
            sha = hashlib.sha256(data).hexdigest()
            headers |= {"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))}
            raise web.HTTPFound(f"{state.cdn_url}/blobs/{sha}?signed=yes", headers=headers)
        if path == "moved_small.txt":
            headers |= {"ETag": f'"{git_sha1(data)}"', "X-Linked-Size": str(len(data))}
            raise web.HTTPTemporaryRedirect(f"{state.cdn_url}/small/{path}", headers=headers)
        headers |= {"ETag": f'"{git_sha1(data)}"', "Content-Length": str(len(data))}
        if request.method == "HEAD":
            return web.Response(headers=headers)
        if path == state.flip_small:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return web.Response(body=data, headers=headers)

    async def small(request: web.Request) -> web.StreamResponse:
        state.cdn.append(seen(request))
        return web.Response(body=files[request.match_info["path"]])

    async def blob(request: web.Request) -> web.StreamResponse:
        state.cdn.append(seen(request))
        data = blobs[request.match_info["sha"]]
        if state.flip == request.match_info["sha"]:
            data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
        rng = request.headers.get("Range")
        if rng is None:
            return web.Response(body=data)
        first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
        return web.Response(
            status=206,
            body=data[first : last + 1],
            headers={"Content-Range": f"bytes {first}-{last}/{len(data)}"},
        )

    hub = web.Application()
    hub.router.add_get(f"/api/models/{REPO}/revision/{{rev}}", revision)
    hub.router.add_get(f"/api/models/{REPO}/tree/{{tail:.*}}", tree)
    hub.router.add_route("*", f"/{REPO}/resolve/{COMMIT}/{{path:.*}}", resolve)
    cdn = web.Application()
    cdn.router.add_get("/blobs/{sha}", blob)
    cdn.router.add_get("/small/{path:.*}", small)
    hub_runner, state.hub_url = await _serve(hub)
    cdn_runner, state.cdn_url = await _serve(cdn)
    try:
        yield state, files
    finally:
        await hub_runner.cleanup()
        await cdn_runner.cleanup()


def request_for(tmp_path: Path) -> FetchRequest:
    return FetchRequest(
        storage_uri=f"hf://{REPO}", dest=tmp_path / "dest", staging=tmp_path / "staging", previous=None, token=TOKEN
    )


def source(f: Fakes) -> HuggingFaceSource:
    return HuggingFaceSource(f.hub_url, ranged=RangedConfig(part_size=128 * KiB, concurrency=4))


async def test_weights_come_in_ranges_from_the_redirect_target_without_the_token(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path
) -> None:
    f, files = fakes
    req = request_for(tmp_path)
    result = await source(f).fetch(req)

    assert result.revision == COMMIT
    assert {r.path for r in result.files} == set(files)
    for path, data in files.items():
        assert (req.staging / path).read_bytes() == data, path
    by_path = {r.path: r for r in result.files}
    assert by_path["model.safetensors"].sha256 == hashlib.sha256(files["model.safetensors"]).hexdigest()

    big = hashlib.sha256(files["model.safetensors"]).hexdigest()
    ranges = [s.range for s in f.cdn if s.path == f"/blobs/{big}"]
    assert len(ranges) == 8 and all(r is not None for r in ranges), ranges  # 1 MiB in 128 KiB parts
    assert all(s.authorization is None for s in f.cdn), "the hub token leaked to the CDN"
    assert all(s.authorization == f"Bearer {TOKEN}" for s in f.hub)


async def test_a_flipped_byte_from_the_cdn_is_caught_and_nothing_is_kept(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path
) -> None:
    f, files = fakes
    f.flip = hashlib.sha256(files["model.safetensors"]).hexdigest()
    req = request_for(tmp_path)
    with pytest.raises(SourceError) as err:
        await source(f).fetch(req)
    assert err.value.reason == "VerificationFailed"
    assert "model.safetensors" in str(err.value)
    assert not (req.staging / "model.safetensors").exists()  # bytes that failed verification are not kept


async def test_weights_start_largest_first(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file at a time shows the order: a whole model does not end with a large file fetched alone."""
    monkeypatch.setattr(hf_module, "MAX_PARALLEL_FILES", 1)
    f, files = fakes
    await source(f).fetch(request_for(tmp_path))

    by_blob = {hashlib.sha256(data).hexdigest(): path for path, data in files.items() if path.endswith(".safetensors")}
    order = list(dict.fromkeys(by_blob[s.path.removeprefix("/blobs/")] for s in f.cdn if s.path.startswith("/blobs/")))
    assert order == ["model.safetensors", "shards/part-2.safetensors", "adapter.safetensors"]


async def fetched_record(f: Fakes, tmp_path: Path, path: str) -> tuple[FetchRequest, FileRecord]:
    """The whole model fetched; the request and the record of ``path``."""
    req = request_for(tmp_path)
    result = await source(f).fetch(req)
    return req, next(r for r in result.files if r.path == path)


async def test_small_files_come_through_the_engine_checked_against_their_git_blob_id(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path
) -> None:
    """One session for every file: a small file is one plain GET of its resolve URL (no metadata HEAD first),
    with the token (it goes to the hub), verified by its git blob sha1, with no huggingface_hub download
    bookkeeping left in staging."""
    f, files = fakes
    req, config = await fetched_record(f, tmp_path, "config.json")
    assert config.git_sha1 == git_sha1(files["config.json"])
    assert config.sha256 == hashlib.sha256(files["config.json"]).hexdigest()
    asked = [(s.method, s.range, s.authorization) for s in f.hub if s.path.endswith("/config.json")]
    assert asked == [("GET", None, f"Bearer {TOKEN}")]
    assert not (req.staging / ".cache" / "huggingface").exists()


async def test_a_small_file_whose_resolve_url_redirects_is_fetched_from_the_location_without_the_token(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path
) -> None:
    """The engine follows no redirect: the source looks the location up (one HEAD) and asks there, and the token
    stays with the hub."""
    f, files = fakes
    req, moved = await fetched_record(f, tmp_path, "moved_small.txt")
    assert moved.git_sha1 == git_sha1(files["moved_small.txt"])
    assert (req.staging / "moved_small.txt").read_bytes() == files["moved_small.txt"]
    assert [s.method for s in f.hub if s.path.endswith("/moved_small.txt")] == ["GET", "HEAD"]
    at_cdn = [s for s in f.cdn if s.path == "/small/moved_small.txt"]
    assert [(s.method, s.authorization) for s in at_cdn] == [("GET", None)]


async def test_a_flipped_byte_in_a_small_file_is_caught_and_not_kept(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path
) -> None:
    f, _files = fakes
    f.flip_small = "config.json"
    req = request_for(tmp_path)
    with pytest.raises(SourceError) as err:
        await source(f).fetch(req)
    assert err.value.reason == "VerificationFailed"
    assert "config.json" in str(err.value)
    assert not (req.staging / "config.json").exists()


# ------------------------------------------------------------------------------------------ shared resolve records


def _forged_record(cache: Any, api: Any, uri: str, commit: str, path: str, data: bytes) -> None:
    """What a stolen node token can PATCH: a resolve record listing the attacker's bytes for ``path``."""
    import time

    name = cache.name(uri)
    listed = [{"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "git_sha1": None}]
    api.leases[name] = {
        "metadata": {"name": name, "resourceVersion": "1"},
        "data": {"uri": uri, "commit": commit, "files": json.dumps(listed), "at": str(time.time())},
    }


async def test_a_forged_resolve_record_never_makes_a_node_publish_bytes_from_a_rogue_peer(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path
) -> None:
    """A record any node can write names the attacker's sha256 for ``model.safetensors``, and a rogue holder serves
    bytes matching it. The node confirms the record with the hub (its own tree listing), takes the hub's digests,
    and publishes the hub's bytes; the rogue's bytes match no digest it asks for, and the record is rewritten."""
    from model_agent.agent.resolve_cache import ResolveCache
    from model_agent.peers.bans import Bans
    from model_agent.peers.fetch import PeerFetcher
    from model_agent.sources.egress import CLUSTER_KIND, Owner
    from tests.unit.test_peers_fetch import FakeDirectory, peer
    from tests.unit.test_shared_root import LeaseApi

    f, files = fakes
    evil = b"attacker-chosen weights " * 4000
    uri = f"hf://{REPO}@{COMMIT}"
    api = LeaseApi()
    cache = ResolveCache(api, "ome")  # type: ignore[arg-type]
    _forged_record(cache, api, uri, COMMIT, "model.safetensors", evil)
    async with peer(tmp_path / "rogue", evil) as rogue:
        peers = PeerFetcher(FakeDirectory([rogue]), Bans(60), lambda: "tok", ranged=RangedConfig(part_size=64 * KiB))  # type: ignore[arg-type]
        hf = HuggingFaceSource(f.hub_url, resolve_cache=cache, peers=peers, ranged=RangedConfig(part_size=128 * KiB))
        request = FetchRequest(
            storage_uri=uri,
            dest=tmp_path / "dest",
            staging=tmp_path / "staging",
            previous=None,
            owner=Owner(CLUSTER_KIND),
        )
        result = await hf.fetch(request)
    by_path = {r.path: r for r in result.files}
    assert set(by_path) == set(files)  # the hub's listing, not the record's one file
    assert by_path["model.safetensors"].sha256 == hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert (request.staging / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert any("/tree/" in s.path for s in f.hub)  # the node asked the hub itself
    record = json.loads(api.leases[cache.name(uri)]["data"]["files"])
    assert {r["path"] for r in record} == set(files)  # the forged record is replaced by the hub's answer


async def test_a_record_for_a_pinned_revision_is_used_as_it_is_only_for_origin_bytes_of_that_commit(
    fakes: tuple[Fakes, dict[str, bytes]], tmp_path: Path
) -> None:
    """No peers, the record names the pinned commit: no hub listing, and a forged digest can only fail the
    verification of the origin's own bytes (nothing foreign is published)."""
    from model_agent.agent.resolve_cache import ResolveCache
    from tests.unit.test_shared_root import LeaseApi

    f, files = fakes
    uri = f"hf://{REPO}@{COMMIT}"
    api = LeaseApi()
    cache = ResolveCache(api, "ome")  # type: ignore[arg-type]
    _forged_record(cache, api, uri, COMMIT, "model.safetensors", b"x" * len(files["model.safetensors"]))
    hf = HuggingFaceSource(f.hub_url, resolve_cache=cache, ranged=RangedConfig(part_size=128 * KiB))
    request = FetchRequest(storage_uri=uri, dest=tmp_path / "dest", staging=tmp_path / "staging", previous=None)
    with pytest.raises(SourceError) as failed:
        await hf.fetch(request)
    assert failed.value.reason == "VerificationFailed"
    assert not any("/tree/" in s.path or "/revision/" in s.path for s in f.hub)


@pytest.mark.parametrize(
    ("revision", "recorded", "peers", "confirm"),
    [
        (COMMIT, COMMIT, False, False),  # pinned, origin bytes only: the record as it is
        (COMMIT, COMMIT, True, True),  # bytes may come from peers: only digests from the hub itself
        (COMMIT, "f" * 40, False, True),  # the record names another commit than the one pinned
        ("main", COMMIT, False, True),  # a branch: the record's commit could be any commit of the repo
    ],
)
def test_record_needs_confirming(revision: str, recorded: str, peers: bool, confirm: bool) -> None:
    assert hf_module.record_needs_confirming(revision, recorded, peers) is confirm
