"""``kill -9`` of the agent in the middle of a 2 GiB object: after a restart it resumes, it does not start over.

The object is served by a real S3 server (moto) through a counting proxy, so the bytes fetched are counted at
the server side, not taken from the agent's word. The bound the engine promises: a kill costs at most the parts
in flight, ``multipart-concurrency x multipart-part-size`` bytes fetched again.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.proxies.countingproxy import CountingProxy
from testbed.servers.moto import MotoServer, create_bucket
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

if TYPE_CHECKING:
    from types_boto3_s3.type_defs import CompletedPartTypeDef

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
MiB = 1024 * 1024
SIZE = 2048 * MiB
UPLOAD_PART = 64 * MiB
PART = 16 * MiB
IN_FLIGHT = 4


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto-resume")) as server:
        yield server


def upload_large_object(moto: MotoServer, bucket: str, key: str, size: int) -> str:
    """A multipart upload of ``size`` random bytes, one part in memory at a time; returns their sha256.

    The ETag of a multipart object is not an MD5, so the MD5 goes into ``md5chksum`` metadata (as rclone
    writes it) and the agent verifies the whole object against it. Metadata is set when the upload is created,
    so the parts (generated from one seed) are hashed first, then uploaded."""
    client = moto.client(read_timeout=900)
    create_bucket(client, bucket)
    seed = os.urandom(UPLOAD_PART)

    def part(number: int) -> bytes:  # distinct parts (no two equal) from one random block
        length = min(UPLOAD_PART, size - (number - 1) * UPLOAD_PART)
        return hashlib.sha256(number.to_bytes(8, "big")).digest() * 2 + seed[64:length]

    numbers = range(1, -(-size // UPLOAD_PART) + 1)
    sha, md5 = hashlib.sha256(), hashlib.md5()
    for number in numbers:
        body = part(number)
        sha.update(body)
        md5.update(body)
    metadata = {"md5chksum": base64.b64encode(md5.digest()).decode()}
    created = client.create_multipart_upload(Bucket=bucket, Key=key, Metadata=metadata)
    parts: list[CompletedPartTypeDef] = []
    for number in numbers:
        done = client.upload_part(
            Bucket=bucket, Key=key, UploadId=created["UploadId"], PartNumber=number, Body=part(number)
        )
        parts.append({"ETag": done["ETag"], "PartNumber": number})
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=created["UploadId"], MultipartUpload={"Parts": parts}
    )
    return sha.hexdigest()


async def test_kill_mid_download_resumes_and_refetches_at_most_the_parts_in_flight(
    kube: Kube, moto: MotoServer, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    bucket = f"resume-{unique}".replace("_", "-")
    key = "big/model.safetensors"
    sha256 = await asyncio.to_thread(upload_large_object, moto, bucket, key, SIZE)
    with CountingProxy(moto.endpoint) as proxy:
        agent = await make_agent(
            args=("--multipart-concurrency", str(IN_FLIGHT), "--multipart-part-size", f"{PART // MiB}Mi")
        )
        name = f"resume-{unique}"
        dest = agent.models_root / name
        await kube.apply(
            cbm(name, f"s3://{bucket}/big", str(dest), parameters={"endpoint": proxy.endpoint, "anonymous": "true"})
        )

        async def half_served() -> bool:
            return proxy.bytes_sent(f"/{key}") >= SIZE // 2

        await eventually(half_served, timeout=600, interval=0.05, what="half of the object served")
        agent.kill()
        served_before_kill = proxy.bytes_sent(f"/{key}")
        assert served_before_kill < SIZE, "the download finished before the kill: nothing to resume"

        agent.start()
        await asyncio.to_thread(agent.wait_ready)

        async def ready() -> bool:
            labels = await kube.node_labels(agent.node)
            entry = await kube.entry(agent.node, configmap_key(CBM, "", name)) or {}
            return labels.get(node_label_key(CBM, "", name)) == "Ready" and entry.get("status") == "Ready"

        await eventually(ready, timeout=600, what="the resumed model Ready")
        served_total = proxy.bytes_sent(f"/{key}")

    refetched = served_total - SIZE
    print(f"kill -9 at {served_before_kill} of {SIZE} bytes served; {refetched} bytes fetched again after the restart")
    assert 0 <= refetched <= IN_FLIGHT * PART, (
        f"served {served_total} bytes for a {SIZE}-byte object ({served_before_kill} before the kill): "
        f"{refetched} fetched again, more than {IN_FLIGHT} parts in flight x {PART} bytes"
    )
    path = dest / "model.safetensors"
    assert path.stat().st_size == SIZE

    def file_sha256() -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(8 * MiB):
                h.update(chunk)
        return h.hexdigest()

    assert await asyncio.to_thread(file_sha256) == sha256
    await kube.delete_model(CBM, name)
