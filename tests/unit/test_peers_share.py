"""Where a fetch's bytes came from: counted by the ``hf://`` source per place, kept by the fetcher for the Ready entry.

The hub and its CDN are the fakes of ``tests/unit/test_hf_source.py``; the peer is a real peer server
(``tests/unit/test_peers_fetch.py``) holding one of the model's LFS files.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from model_agent.agent.fetcher import Fetcher, Job
from model_agent.model.entry import BytesBySource
from model_agent.peers.bans import Bans
from model_agent.peers.fetch import PeerFetcher
from model_agent.sources.base import Progress
from model_agent.sources.byte_sources import SourcedProgress, by_source
from model_agent.sources.egress import NAMESPACED_KIND, Owner
from model_agent.sources.hf import HuggingFaceSource
from model_agent.transfer import RangedConfig
from tests.support.waiting import until
from tests.unit.test_hf_source import Fakes, KiB, fakes, git_sha1, request_for  # noqa: F401  (fakes: the fixture)
from tests.unit.test_peers_fetch import FakeDirectory, peer


def hf_with_peers(f: Fakes, address: str) -> HuggingFaceSource:
    peers = PeerFetcher(
        FakeDirectory([address]),  # type: ignore[arg-type]
        Bans(60),
        lambda: "good",
        ranged=RangedConfig(part_size=128 * KiB, durable=False),
    )
    return HuggingFaceSource(f.hub_url, ranged=RangedConfig(part_size=128 * KiB, concurrency=4), peers=peers)


async def test_the_progress_counts_peer_and_origin_bytes(
    fakes: tuple[Fakes, dict[str, bytes]],  # noqa: F811
    tmp_path: Path,
) -> None:
    f, files = fakes
    weights = files["model.safetensors"]
    async with peer(tmp_path / "peer", weights) as address:
        seen: list[Progress] = []
        request = request_for(tmp_path)
        request.on_progress = seen.append
        await hf_with_peers(f, address).fetch(request)
    sources = by_source(seen[-1])
    total = sum(len(b) for b in files.values())
    # the weights the peer holds came from it; everything else from the origin (the CDN, the hub)
    assert sources == BytesBySource(origin=total - len(weights), peer=len(weights))
    assert hashlib.sha256(weights).hexdigest() not in {s.path.rsplit("/", 1)[-1] for s in f.cdn}


@pytest.mark.parametrize("flip", [False, True], ids=["honest", "lying"])
async def test_a_small_file_is_asked_from_peers_by_its_git_blob_id(
    fakes: tuple[Fakes, dict[str, bytes]],  # noqa: F811
    tmp_path: Path,
    flip: bool,
) -> None:
    # The hub lists a small file's git blob id only: peers are asked by that id, and what one sends is checked
    # against the id the hub listed. An honest peer spares the hub the request; a lying one is banned, and the
    # file comes from the hub, intact.
    f, files = fakes
    config = files["config.json"]
    async with peer(tmp_path / "peer", config, flip=flip, git_sha1=git_sha1(config)) as address:
        seen: list[Progress] = []
        request = request_for(tmp_path)
        request.on_progress = seen.append
        source = hf_with_peers(f, address)
        result = await source.fetch(request)
    asked_hub = [s for s in f.hub if s.path.endswith("/config.json")]
    assert (request.staging / "config.json").read_bytes() == config
    assert [r.git_sha1 for r in result.files if r.path == "config.json"] == [git_sha1(config)]
    sources = by_source(seen[-1])
    assert sources is not None
    if flip:
        assert source.peers is not None and source.peers.bans.banned(address)
        assert len(asked_hub) == 1 and sources.peer == 0
    else:
        assert asked_hub == [] and sources.peer == len(config)


async def test_a_plain_progress_counts_nothing() -> None:
    assert by_source(Progress(phase="downloading")) is None
    assert by_source(None) is None
    assert by_source(SourcedProgress(peer_bytes=5, origin_bytes=-1)) == BytesBySource(origin=0, peer=5)


async def test_the_fetcher_keeps_a_finished_fetchs_counts_until_the_next_fetch_or_a_removal() -> None:
    done: list[str] = []
    fetcher = Fetcher(2, done.append)
    key = "ClusterBaseModel//m"
    go_on = asyncio.Event()

    async def from_peers(job: Job) -> None:
        job.progress = SourcedProgress(phase="finalizing", origin_bytes=3, peer_bytes=97)

    async def plain(job: Job) -> None:
        job.progress = Progress(phase="finalizing")
        await go_on.wait()

    assert await fetcher.submit(key, "t1", from_peers)
    await until(lambda: done == [key], "the first fetch done")
    assert fetcher.bytes_by_source(key) == BytesBySource(origin=3, peer=97)
    assert await fetcher.submit(key, "t2", plain)  # a new copy is on its way: the old counts no longer apply
    assert fetcher.bytes_by_source(key) is None
    go_on.set()
    await until(lambda: done == [key, key], "the second fetch done")
    assert fetcher.bytes_by_source(key) is None  # a source that does not count: nothing, never a guess
    assert await fetcher.submit(key, "t3", from_peers)
    await until(lambda: len(done) == 3, "the third fetch done")
    fetcher.clear_failure(key)  # the model went away
    assert fetcher.bytes_by_source(key) is None
    await fetcher.stop()


async def test_a_tenant_takes_no_bytes_from_peers(
    fakes: tuple[Fakes, dict[str, bytes]],  # noqa: F811
    tmp_path: Path,
) -> None:
    f, files = fakes
    async with peer(tmp_path / "peer", files["model.safetensors"]) as address:
        seen: list[Progress] = []
        request = request_for(tmp_path)
        request.on_progress = seen.append
        request.owner = Owner(NAMESPACED_KIND, "team-a")  # a BaseModel outside --trusted-namespace
        await hf_with_peers(f, address).fetch(request)
    total = sum(len(b) for b in files.values())
    assert by_source(seen[-1]) == BytesBySource(origin=total, peer=0)  # every byte from the origin
    weights = hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert weights in {s.path.rsplit("/", 1)[-1] for s in f.cdn}  # the weights too, from the CDN
