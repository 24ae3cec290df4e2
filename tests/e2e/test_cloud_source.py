"""The gs:// and az:// source against real emulators (fake-gcs-server, Azurite): fetch, verify, reuse, refuse."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

import aiohttp
import pytest

from model_agent.local.manifest import Manifest
from model_agent.sources.base import FetchRequest, FetchResult, SourceError, publish
from model_agent.sources.cloud import CloudSource, expected_from_probe, settings_for
from model_agent.transfer import PARTS_DIR, RangedConfig, part_map_path
from testbed.servers import azurite as az
from testbed.servers import fakegcs
from testbed.servers.azurite import AzuriteServer
from testbed.servers.fakegcs import FakeGcsServer

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "shards/model-00001.safetensors": os.urandom(9 * MiB + 17),
    "tokenizer/vocab.txt": b"a\nb\n",
}


def request_for(
    tmp_path: Path, uri: str, endpoint: str, secret: dict[str, str], previous: Manifest | None = None
) -> FetchRequest:
    return FetchRequest(
        storage_uri=uri,
        dest=tmp_path / "models" / "tiny",
        staging=tmp_path / "staging" / "tiny",
        previous=previous,
        parameters={"endpoint": endpoint},
        secret=secret,
    )


def source() -> CloudSource:
    return CloudSource(ranged=RangedConfig(part_size=4 * MiB, concurrency=4))


async def fetch_and_publish(src: CloudSource, request: FetchRequest) -> tuple[FetchResult, Manifest]:
    result = await src.fetch(request)
    files = await asyncio.to_thread(publish, request, result)
    return result, Manifest(key="k", uid="u", storage_uri=request.storage_uri, dest=str(request.dest), files=files)


def assert_identical(dest: Path, files: dict[str, bytes]) -> None:
    on_disk = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert on_disk == sorted(files)
    for rel, data in files.items():
        assert hashlib.sha256((dest / rel).read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest(), rel


@pytest.fixture
async def gcs_bucket(fake_gcs: FakeGcsServer, unique: str) -> str:
    bucket = f"models-{unique}"
    await asyncio.to_thread(fakegcs.create_bucket, fake_gcs.endpoint, bucket)
    await asyncio.to_thread(
        fakegcs.upload_objects, fake_gcs.endpoint, bucket, {f"llama/{k}": v for k, v in FILES.items()}
    )
    return bucket


@pytest.fixture
async def az_container(azurite: AzuriteServer, unique: str) -> str:
    container = f"models-{unique}"
    await asyncio.to_thread(az.create_container, azurite.endpoint, container)
    await asyncio.to_thread(az.upload_blobs, azurite.endpoint, container, {f"llama/{k}": v for k, v in FILES.items()})
    return container


async def test_gcs_fetch_verifies_md5_publishes_then_reuses(
    fake_gcs: FakeGcsServer, gcs_bucket: str, tmp_path: Path
) -> None:
    secret = {"serviceAccountKey": fakegcs.service_account_key()}
    src = source()
    request = request_for(tmp_path, f"gs://{gcs_bucket}/llama", fake_gcs.endpoint, secret)
    result, manifest = await fetch_and_publish(src, request)
    assert sorted(result.staged) == sorted(FILES)
    assert_identical(request.dest, FILES)
    assert {f.path: f.sha256 for f in manifest.files} == {k: hashlib.sha256(v).hexdigest() for k, v in FILES.items()}
    again = request_for(tmp_path, f"gs://{gcs_bucket}/llama", fake_gcs.endpoint, secret, previous=manifest)
    second = await src.fetch(again)
    assert second.staged == [] and second.revision == result.revision  # one listing, nothing fetched


async def test_gcs_probe_carries_the_published_md5(fake_gcs: FakeGcsServer, gcs_bucket: str, tmp_path: Path) -> None:
    """What the engine is told to check for one object: the store's MD5, the size, the ETag."""
    src = source()
    request = request_for(
        tmp_path, f"gs://{gcs_bucket}/llama", fake_gcs.endpoint, {"serviceAccountKey": fakegcs.service_account_key()}
    )
    settings = settings_for(request)
    store = src.store(settings)
    objects = {o.path: o for o in await src.list_objects(store, settings)}
    shard = objects["shards/model-00001.safetensors"]
    url = await src.signer(store, settings).url(shard.key)
    async with aiohttp.ClientSession() as session, session.get(url, headers={"Range": "bytes=0-0"}) as resp:
        expected = expected_from_probe(resp.status, resp.headers, shard)
    data = FILES["shards/model-00001.safetensors"]
    assert expected.size == len(data) and expected.checksums == {"md5": hashlib.md5(data).hexdigest()}


async def test_azure_fetch_with_account_key_then_reuse(
    azurite: AzuriteServer, az_container: str, tmp_path: Path
) -> None:
    secret = {"accountKey": az.ACCOUNT_KEY}
    uri = f"az://{az.ACCOUNT}/{az_container}/llama"
    src = source()
    request = request_for(tmp_path, uri, azurite.endpoint, secret)
    result, manifest = await fetch_and_publish(src, request)
    assert_identical(request.dest, FILES)
    assert not (request.dest / PARTS_DIR).exists()
    second = await src.fetch(request_for(tmp_path, uri, azurite.endpoint, secret, previous=manifest))
    assert second.staged == [] and second.revision == result.revision


async def test_azure_sas_token_from_the_secret(azurite: AzuriteServer, az_container: str, tmp_path: Path) -> None:
    """A SAS in the Secret is used as is for the listing and appended to each blob URL (no signing)."""
    sas = container_sas(az_container)
    request = request_for(tmp_path, f"az://{az.ACCOUNT}/{az_container}/llama", azurite.endpoint, {"sasToken": sas})
    await fetch_and_publish(source(), request)
    assert_identical(request.dest, FILES)


def container_sas(container: str) -> str:
    """A read+list service SAS for ``container``, signed with the development key (Azure's documented format)."""
    version = "2021-08-06"
    start = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    expiry = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fields = [
        "rl",
        start,
        expiry,
        f"/blob/{az.ACCOUNT}/{container}",
        "",
        "",
        "",
        version,
        "c",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
    ]
    sig = base64.b64encode(
        hmac.new(base64.b64decode(az.ACCOUNT_KEY), "\n".join(fields).encode(), hashlib.sha256).digest()
    ).decode()
    return urlencode({"sv": version, "sp": "rl", "st": start, "se": expiry, "sr": "c", "sig": sig})


async def test_refusals_have_reasons(
    azurite: AzuriteServer, az_container: str, fake_gcs: FakeGcsServer, gcs_bucket: str, tmp_path: Path
) -> None:
    cases = [
        (f"az://{az.ACCOUNT}/{az_container}/llama", azurite.endpoint, {"accountKey": "d3Jvbmc="}, "AccessDenied"),
        (
            f"az://{az.ACCOUNT}/missing-{az_container}/llama",
            azurite.endpoint,
            {"accountKey": az.ACCOUNT_KEY},
            "BucketNotFound",
        ),
        (
            f"az://{az.ACCOUNT}/{az_container}/nothing-here",
            azurite.endpoint,
            {"accountKey": az.ACCOUNT_KEY},
            "NoObjects",
        ),
        (
            f"gs://{gcs_bucket}/nothing-here",
            fake_gcs.endpoint,
            {"serviceAccountKey": fakegcs.service_account_key()},
            "NoObjects",
        ),
        (f"gs://{gcs_bucket}/llama", fake_gcs.endpoint, {"serviceAccountKey": json.dumps({"x": 1})}, "SecretInvalid"),
    ]
    for uri, endpoint, secret, reason in cases:
        with pytest.raises(SourceError) as err:
            await source().fetch(request_for(tmp_path, uri, endpoint, secret))
        assert err.value.reason == reason, (uri, err.value.message)
        assert "sig=" not in err.value.message


async def test_cancelled_fetch_resumes_from_completed_parts(
    azurite: AzuriteServer, az_container: str, tmp_path: Path
) -> None:
    big = os.urandom(24 * MiB)
    await asyncio.to_thread(az.upload_blobs, azurite.endpoint, az_container, {"big/big.bin": big})
    src = CloudSource(ranged=RangedConfig(part_size=4 * MiB, concurrency=2), max_parallel_files=1)
    uri = f"az://{az.ACCOUNT}/{az_container}/big"
    secret = {"accountKey": az.ACCOUNT_KEY}
    req = request_for(tmp_path, uri, azurite.endpoint, secret)
    enough = asyncio.Event()
    req.on_progress = lambda p: enough.set() if p.completed_bytes >= 8 * MiB else None
    task = asyncio.ensure_future(src.fetch(req))
    waiter = asyncio.ensure_future(enough.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    assert not task.done(), "the fetch finished before it could be cancelled"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = json.loads(part_map_path(req.staging, "big.bin").read_bytes())
    recorded = sum(bin(b).count("1") for b in base64.b64decode(state["done"]))
    assert 1 <= recorded < 6

    again = request_for(tmp_path, uri, azurite.endpoint, secret)
    seen: list[tuple[int, int]] = []
    again.on_progress = lambda p: seen.append((p.completed_files, p.completed_bytes))
    result = await src.fetch(again)
    fetched_before_done = max(b for files, b in seen if files == 0)
    assert fetched_before_done == len(big) - recorded * 4 * MiB  # only the parts not recorded were fetched
    await asyncio.to_thread(publish, again, result)
    assert hashlib.sha256((again.dest / "big.bin").read_bytes()).digest() == hashlib.sha256(big).digest()
