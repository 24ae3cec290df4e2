"""``oci://`` with ``s3Compat``: the model is fetched through an S3 API (moto standing in for OCI's
S3-compatible endpoint) by the S3 source, with the Secret's key pair, and the OCI SDK is never used."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_agent.sources.base import FetchRequest, SourceError, publish
from model_agent.sources.oci import OciSource
from model_agent.transfer import RangedConfig
from testbed.servers.moto import MotoServer, create_bucket, upload_objects

pytestmark = pytest.mark.e2e

BUCKET = "oci-compat-models"
MODEL = {"llama/config.json": b'{"architectures": ["LlamaForCausalLM"]}', "llama/w.bin": os.urandom(300_000)}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto-oci")) as server:
        client = server.client()
        create_bucket(client, BUCKET)
        upload_objects(client, BUCKET, MODEL)
        yield server


def request_for(s3: MotoServer, tmp_path: Path, secret: dict[str, str] | None) -> FetchRequest:
    return FetchRequest(
        storage_uri=f"oci://n/faketenancy/b/{BUCKET}/o/llama",
        dest=tmp_path / "models" / "llama",
        staging=tmp_path / "staging" / "llama",
        previous=None,
        parameters={"s3Compat": "true", "endpoint": s3.endpoint, "region": "us-east-1"},
        secret=secret,
    )


async def test_s3_compat_fetch_goes_through_the_s3_api(s3: MotoServer, tmp_path: Path) -> None:
    source = OciSource(ranged=RangedConfig(durable=False))
    request = request_for(s3, tmp_path, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    mark = s3.mark()
    result = await source.fetch(request)
    publish(request, result)
    for key, data in MODEL.items():
        path = request.dest / key.removeprefix("llama/")
        assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert any(f"/{BUCKET}?" in r.path or f"/{BUCKET}/" in r.path for r in s3.requests(mark))  # path-style
    assert source._clients == {}  # no OCI client or signer was built


async def test_s3_compat_with_a_malformed_secret_is_refused(s3: MotoServer, tmp_path: Path) -> None:
    with pytest.raises(SourceError) as err:
        await OciSource().fetch(request_for(s3, tmp_path, {"user": "x"}))
    assert err.value.reason == "SecretInvalid"
