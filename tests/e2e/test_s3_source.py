"""The S3 source against a real S3 API (moto's server mode on loopback): fetch, publish, reuse, refuse."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_agent.local.capacity import CapacityRegistry, DiskReserve, DiskUsage
from model_agent.local.manifest import Manifest
from model_agent.sources.base import FetchRequest, Progress, SourceError, publish
from model_agent.sources.s3 import CHECKSUM_MODE_HEADER, S3Source, checksums_of_answer
from model_agent.transfer import PARTS_DIR, Expected, RangedConfig, engine_session, part_map_name
from testbed.servers.moto import MotoServer, create_bucket, upload_objects

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
BUCKET = "models-bucket"
SECRET = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def safetensors_bytes() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)


CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()
WEIGHTS = safetensors_bytes()
BIG = os.urandom(40 * MiB)
MODEL = {
    "tiny/config.json": CONFIG,
    "tiny/model.safetensors": WEIGHTS,
    "tiny/shards/big.bin": BIG,
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto")) as server:
        client = server.client()
        create_bucket(client, BUCKET)
        etags = upload_objects(client, BUCKET, MODEL, multipart_threshold=16 * MiB, part_size=8 * MiB)
        assert etags["tiny/shards/big.bin"].endswith('-5"')  # a multipart ETag: not an MD5
        upload_objects(client, BUCKET, {"tiny/": b"", "tiny2/not-mine.txt": b"other model"})  # marker, neighbour
        yield server


class Counted:
    """Counts the S3 API operations boto3 makes (the data GETs go through the ranged engine, not boto3)."""

    def __init__(self) -> None:
        self.operations: Counter[str] = Counter()

    def hook(self, client: Any) -> None:
        client.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.operations[model.name] += 1


def request_for(
    s3: MotoServer, tmp_path: Path, uri: str, previous: Manifest | None = None, **params: str
) -> FetchRequest:
    return FetchRequest(
        storage_uri=uri,
        dest=tmp_path / "models" / "tiny",
        staging=tmp_path / "staging" / "tiny",
        previous=previous,
        parameters={"endpoint": s3.endpoint, "addressingStyle": "path", **params},
        secret=dict(SECRET),
    )


def source(counted: Counted | None = None, **kw: Any) -> S3Source:
    return S3Source(
        ranged=RangedConfig(part_size=8 * MiB, concurrency=4),
        page_size=2,  # forces the listing to paginate
        on_client=counted.hook if counted else None,
        **kw,
    )


def object_gets(s3: MotoServer, since: int) -> list[str]:
    return [r.path for r in s3.requests(since) if r.method == "GET" and r.path.startswith(f"/{BUCKET}/")]


async def test_a_small_objects_get_states_its_checksums_and_they_are_checked(s3: MotoServer, tmp_path: Path) -> None:
    """moto answers a GET signed with checksum mode with the object's checksums, as S3 does: the one-request path
    checks the CRC32 the object was stored with and its single-part ETag as an MD5, and refuses a lying answer."""
    client = s3.client()
    data = b'{"small": true}\n' * 64
    key = "checked/small.json"
    client.put_object(Bucket=BUCKET, Key=key, Body=data, ChecksumAlgorithm="CRC32")
    etag = client.head_object(Bucket=BUCKET, Key=key)["ETag"]
    params = {"Bucket": BUCKET, "Key": key, "ChecksumMode": "ENABLED"}
    url = client.generate_presigned_url("get_object", Params=params, ExpiresIn=600)
    expected = Expected(len(data), validator=etag, checksums_from_answer=checksums_of_answer(len(data), etag))
    async with engine_session(RangedConfig()) as engine:
        got = await engine.download(url, tmp_path / "small.json", expected, headers=CHECKSUM_MODE_HEADER)
    assert got.digests["crc32"] == f"{zlib.crc32(data):08x}"
    assert got.digests["md5"] == hashlib.md5(data).hexdigest() == etag.strip('"')
    assert got.requests == 1

    def lying(headers: Any) -> dict[str, str]:
        return {"crc32": "00000000"}

    async with engine_session(RangedConfig()) as engine:
        with pytest.raises(SourceError) as err:
            await engine.download(
                url,
                tmp_path / "lied.json",
                Expected(len(data), checksums_from_answer=lying),
                headers=CHECKSUM_MODE_HEADER,
            )
    assert err.value.reason == "VerificationFailed" and not (tmp_path / "lied.json").exists()


async def test_fetch_publish_then_refetch_nothing(s3: MotoServer, tmp_path: Path) -> None:
    counted = Counted()
    src = source(counted)
    req = request_for(s3, tmp_path, f"s3://{BUCKET}@us-east-1/tiny")
    mark = s3.mark()
    result = await src.fetch(req)
    assert sorted(result.staged) == ["config.json", "model.safetensors", "shards/big.bin"]
    assert counted.operations["ListObjectsV2"] == 2  # 3 keys + the folder marker, 2 per page
    # Only the large object is HEADed: a small one (fetched in one request) is one GET with checksum mode, its
    # checksums read from that answer.
    assert counted.operations["HeadObject"] == 1
    gets = object_gets(s3, mark)
    assert sum("big.bin" in g for g in gets) == 5  # 40 MiB in 8 MiB ranges
    assert sum("/config.json" in g for g in gets) == 1 and sum("model.safetensors" in g for g in gets) == 1
    assert not any("not-mine" in g for g in gets)  # "tiny2/" is not under "tiny/"

    files = publish(req, result)
    dest = req.dest
    for key, data in MODEL.items():
        assert (dest / key.removeprefix("tiny/")).read_bytes() == data
    assert not (dest / ".cache").exists() and not req.staging.exists()
    by_path = {f.path: f for f in files}
    assert by_path["shards/big.bin"].sha256 == hashlib.sha256(BIG).hexdigest()
    assert by_path["shards/big.bin"].etag is not None and by_path["shards/big.bin"].etag.endswith('-5"')
    assert by_path["config.json"].etag == f'"{hashlib.md5(CONFIG).hexdigest()}"'

    # The manifest round-trips through JSON with the new field, and the next fetch needs only the listing.
    manifest = Manifest.from_json(
        Manifest(key="k", uid="u", storage_uri=req.storage_uri, dest=str(dest), files=files).to_json()
    )
    counted.operations.clear()
    mark = s3.mark()
    again = await src.fetch(request_for(s3, tmp_path, req.storage_uri, previous=manifest))
    assert again.staged == []
    assert [f.path for f in again.files] == sorted(by_path)
    assert dict(counted.operations) == {"ListObjectsV2": 2}
    assert object_gets(s3, mark) == []
    assert [r.method for r in s3.requests(mark)] == ["GET", "GET"]  # the two listing pages, nothing else
    assert all("list-type=2" in r.path for r in s3.requests(mark))


async def test_changed_object_is_the_only_one_fetched(s3: MotoServer, tmp_path: Path) -> None:
    src = source()
    req = request_for(s3, tmp_path, f"s3://{BUCKET}/tiny/")
    files = publish(req, await src.fetch(req))
    manifest = Manifest(key="k", uid="u", storage_uri=req.storage_uri, dest=str(req.dest), files=files)
    new_config = json.dumps({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}).encode()
    client = s3.client()
    upload_objects(client, BUCKET, {"tiny/config.json": new_config})
    try:
        req2 = request_for(s3, tmp_path, req.storage_uri, previous=manifest)
        mark = s3.mark()
        result = await src.fetch(req2)
        assert result.staged == ["config.json"]
        gets = object_gets(s3, mark)
        assert len(gets) == 1 and gets[0].startswith(f"/{BUCKET}/tiny/config.json?")  # one presigned GET
        publish(req2, result)
        assert (req.dest / "config.json").read_bytes() == new_config
        assert (req.dest / "shards" / "big.bin").read_bytes() == BIG
    finally:
        upload_objects(client, BUCKET, {"tiny/config.json": CONFIG})


async def test_files_already_in_place_are_adopted_by_md5(s3: MotoServer, tmp_path: Path) -> None:
    src = source()
    req = request_for(s3, tmp_path, f"s3://{BUCKET}/tiny")
    (req.dest / "shards").mkdir(parents=True)
    (req.dest / "config.json").write_bytes(CONFIG)  # left by a kill between publish and manifest
    (req.dest / "model.safetensors").write_bytes(b"\0" * len(WEIGHTS))  # same size, other bytes
    result = await src.fetch(req)
    assert sorted(result.staged) == ["model.safetensors", "shards/big.bin"]  # big.bin: multipart, no MD5
    publish(req, result)
    assert (req.dest / "model.safetensors").read_bytes() == WEIGHTS


async def test_disk_without_room_is_refused_before_any_transfer(s3: MotoServer, tmp_path: Path) -> None:
    tight = CapacityRegistry(DiskReserve(fraction=0.10), usage=lambda _p: DiskUsage(1, 100 * MiB, 45 * MiB))
    src = source(capacity=tight)
    mark = s3.mark()
    with pytest.raises(SourceError) as err:
        await src.fetch(request_for(s3, tmp_path, f"s3://{BUCKET}/tiny"))
    assert err.value.reason == "InsufficientDisk"
    assert object_gets(s3, mark) == []
    assert tight.reserved(tmp_path) == 0


async def test_errors_are_named(s3: MotoServer, tmp_path: Path) -> None:
    src = source()
    with pytest.raises(SourceError) as err:
        await src.fetch(request_for(s3, tmp_path, "s3://no-such-bucket/tiny"))
    assert err.value.reason == "BucketNotFound"
    with pytest.raises(SourceError) as err:
        await src.fetch(request_for(s3, tmp_path, f"s3://{BUCKET}/nothing-here"))
    assert err.value.reason == "NoObjects"
    bad = request_for(s3, tmp_path, f"s3://{BUCKET}/tiny")
    bad.secret = {"token": "x"}
    with pytest.raises(SourceError) as err:
        await src.fetch(bad)
    assert err.value.reason == "SecretInvalid"

    client = s3.client()
    upload_objects(client, BUCKET, {"evil/ok.txt": b"1", "evil/a/../../escape.txt": b"2"})
    with pytest.raises(SourceError) as err:
        await src.fetch(request_for(s3, tmp_path, f"s3://{BUCKET}/evil"))
    assert err.value.reason == "UnsafeFilePath" and not err.value.retryable
    assert not (tmp_path / "models" / "escape.txt").exists()
    upload_objects(client, BUCKET, {"clash/a": b"file", "clash/a/b": b"under a file"})
    with pytest.raises(SourceError) as err:
        await src.fetch(request_for(s3, tmp_path, f"s3://{BUCKET}/clash"))
    assert err.value.reason == "UnsafeFilePath"


async def test_cancelled_fetch_resumes_from_completed_parts(s3: MotoServer, tmp_path: Path) -> None:
    src = S3Source(ranged=RangedConfig(part_size=8 * MiB, concurrency=2), max_parallel_files=1)
    req = request_for(s3, tmp_path, f"s3://{BUCKET}/tiny")
    enough = asyncio.Event()

    def on_progress(p: Progress) -> None:
        if p.completed_bytes >= 20 * MiB:  # at least one of big.bin's five 8 MiB parts is complete
            enough.set()

    req.on_progress = on_progress
    mark = s3.mark()
    task = asyncio.ensure_future(src.fetch(req))
    waiter = asyncio.ensure_future(enough.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    assert not task.done(), "the fetch finished before it could be cancelled"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    first = sum("big.bin" in g for g in object_gets(s3, mark))
    state = json.loads((req.staging / PARTS_DIR / part_map_name("shards/big.bin")).read_bytes())
    recorded = sum(bin(b).count("1") for b in base64.b64decode(state["done"]))
    assert 1 <= recorded < 5 and first >= recorded

    await asyncio.to_thread(s3.wait_quiet)  # moto still serves (and logs) what the cancelled run asked for
    mark = s3.mark()
    result = await src.fetch(request_for(s3, tmp_path, req.storage_uri))
    again = sum("big.bin" in g for g in object_gets(s3, mark))
    assert again == 5 - recorded  # exactly the parts not recorded before the cancel
    publish(req, result)
    assert (req.dest / "shards" / "big.bin").read_bytes() == BIG


async def test_staged_files_of_an_unpublished_fetch_are_not_fetched_again(s3: MotoServer, tmp_path: Path) -> None:
    src = source()
    req = request_for(s3, tmp_path, f"s3://{BUCKET}/tiny")
    first = await src.fetch(req)  # e.g. killed before publish
    (req.staging / "stray.bin").write_bytes(b"left by something else")
    mark = s3.mark()
    second = await src.fetch(request_for(s3, tmp_path, req.storage_uri))
    assert object_gets(s3, mark) == []  # complete part maps: only LIST and HEADs
    assert sorted(second.staged) == sorted(first.staged)
    assert not (req.staging / "stray.bin").exists()  # never published by accident
    publish(req, second)
    assert (req.dest / "shards" / "big.bin").read_bytes() == BIG
    assert sorted(p.name for p in req.dest.rglob("*") if p.is_file()) == ["big.bin", "config.json", "model.safetensors"]


async def test_objects_start_largest_first(s3: MotoServer, tmp_path: Path) -> None:
    """One object at a time shows the order: a whole model does not end with a large file fetched alone."""
    mark = s3.mark()
    await source(max_parallel_files=1).fetch(request_for(s3, tmp_path, f"s3://{BUCKET}/tiny"))
    keys = [g.removeprefix(f"/{BUCKET}/").split("?")[0] for g in object_gets(s3, mark)]
    assert list(dict.fromkeys(keys)) == ["tiny/shards/big.bin", "tiny/model.safetensors", "tiny/config.json"]
