"""The ``oci://`` source: settings and HEAD rules, then whole fetches against FakeOciObjectStorage.

The fake stands in for OCI Object Storage, which cannot run here; it verifies every request's signature
against a throwaway API key, so these tests exercise the real SDK client and the real signer.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_agent.local.manifest import Manifest
from model_agent.sources.base import FetchRequest, FetchResult, Progress, SourceError, publish
from model_agent.sources.oci import (
    ENDPOINT_ENV,
    OciSource,
    expected_from_head,
    s3_compat_request,
    settings_for,
    uses_storage_secret,
)
from model_agent.transfer import PARTS_DIR, RangedConfig
from tests.support.fake_oci import FakeOciObjectStorage, UserPrincipal, write_user_principal
from tests.support.waiting import eventually

NS = "faketenancy"
MiB = 1024 * 1024


def req(uri: str, tmp: Path | None = None, **params: str) -> FetchRequest:
    base = tmp or Path("/m")
    return FetchRequest(
        storage_uri=uri, dest=base / "models" / "x", staging=base / "staging" / "x", previous=None, parameters=params
    )


def b64md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


# ---------------------------------------------------------------------- pure parts


def test_settings_for_the_three_uri_shapes() -> None:
    one = settings_for(req("oci://n/ns1/b/bkt/o/meta/llama", auth="UserPrincipal"))
    assert (one.namespace, one.bucket, one.prefix, one.region, one.auth) == (
        "ns1",
        "bkt",
        "meta/llama/",
        None,
        "UserPrincipal",
    )
    two = settings_for(req("oci://ns2@eu-frankfurt-1/bkt/llama"))
    assert (two.namespace, two.region, two.auth) == ("ns2", "eu-frankfurt-1", "InstancePrincipal")
    assert settings_for(req("oci://ns2@eu-frankfurt-1/bkt/llama", region="us-ashburn-1")).region == "us-ashburn-1"
    three = settings_for(req("oci://bkt/llama"))
    assert (three.namespace, three.bucket, three.prefix) == ("", "bkt", "llama/")
    assert three.label() == "oci://n/?/b/bkt/o/llama/"


def test_settings_refuse_bad_auth_endpoint_and_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    for uri, params, reason in (
        ("oci://bkt/m", {"auth": "userprincipal"}, "InvalidParameter"),  # exact strings, as OME
        ("oci://bkt/m", {"endpoint": "objectstorage.local"}, "InvalidParameter"),
        ("oci://n/ns/b/bkt/o/", {}, "InvalidStorageUri"),
    ):
        with pytest.raises(SourceError) as err:
            settings_for(req(uri, None, **params))
        assert err.value.reason == reason and not err.value.retryable
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:9/")
    assert settings_for(req("oci://bkt/m")).endpoint == "http://127.0.0.1:9"
    assert settings_for(req("oci://bkt/m", endpoint="https://private.example")).endpoint == "https://private.example"


def test_s3_compat_routing_and_secret_use() -> None:
    assert not uses_storage_secret({}) and not uses_storage_secret({"auth": "UserPrincipal"})
    assert uses_storage_secret({"s3Compat": "true"})
    request = req("oci://n/ns1/b/bkt/o/meta/llama", s3Compat="true", region="us-ashburn-1")
    routed = s3_compat_request(request, settings_for(request))
    assert routed.storage_uri == "s3://bkt/meta/llama/"
    assert routed.parameters == {
        "endpoint": "https://ns1.compat.objectstorage.us-ashburn-1.oraclecloud.com",
        "addressingStyle": "path",
        "region": "us-ashburn-1",
    }
    assert routed.dest == request.dest and routed.staging == request.staging
    with pytest.raises(SourceError) as err:
        no_region = req("oci://n/ns1/b/bkt/o/m", s3Compat="true")
        s3_compat_request(no_region, settings_for(no_region))
    assert err.value.reason == "InvalidParameter"


def test_expected_from_head() -> None:
    data = b"weights"
    single = expected_from_head({"Content-Length": "7", "ETag": "e1", "Content-MD5": b64md5(data)})
    assert (single.size, single.validator, dict(single.checksums)) == (7, "e1", {"md5": hashlib.md5(data).hexdigest()})
    # opc-multipart-md5 is an MD5 of part MD5s, never compared with the file; opc-meta-md5 is (as OME reads it).
    multipart = {"content-length": "7", "etag": "e2", "opc-multipart-md5": "abc=-3"}
    assert dict(expected_from_head(multipart).checksums) == {}
    tagged = expected_from_head({**multipart, "opc-meta-md5": b64md5(data)})
    assert dict(tagged.checksums) == {"md5": hashlib.md5(data).hexdigest()}
    hexed = expected_from_head({**multipart, "opc-meta-md5": hashlib.md5(data).hexdigest().upper()})
    assert dict(hexed.checksums) == {"md5": hashlib.md5(data).hexdigest()}


class RecordingFakeS3Source:
    """Named fake: records the request the OCI source routes to the S3 source in s3Compat mode."""

    def __init__(self) -> None:
        self.requests: list[FetchRequest] = []

    async def fetch(self, request: FetchRequest) -> FetchResult:
        self.requests.append(request)
        return FetchResult(revision="r", files=[])


async def test_s3_compat_mode_goes_through_the_s3_source_without_oci_calls(tmp_path: Path) -> None:
    fake_s3 = RecordingFakeS3Source()
    source = OciSource(s3=fake_s3)  # type: ignore[arg-type]
    request = req("oci://ns1@us-phoenix-1/bkt/llama", tmp_path, s3Compat="true")
    request.secret = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    await source.fetch(request)
    [routed] = fake_s3.requests
    assert routed.storage_uri == "s3://bkt/llama/" and routed.secret == request.secret
    assert routed.parameters["endpoint"] == "https://ns1.compat.objectstorage.us-phoenix-1.oraclecloud.com"
    assert source._clients == {}  # no OCI client (and no signer) was built


# ---------------------------------------------------------------------- against the fake


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> UserPrincipal:
    return write_user_principal(tmp_path_factory.mktemp("oci-identity"))


@pytest.fixture
def fake(identity: UserPrincipal, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOciObjectStorage]:
    monkeypatch.setenv("OCI_CONFIG_PATH", str(identity.config_path))
    monkeypatch.delenv("PROFILE", raising=False)
    monkeypatch.delenv("USE_SESSION_TOKEN", raising=False)
    with FakeOciObjectStorage(NS, {identity.key_id: identity.public_key}) as server:
        yield server


def source(**kwargs: object) -> OciSource:
    ranged = RangedConfig(part_size=1 * MiB, concurrency=4, write_buffer=256 * 1024, durable=False)
    return OciSource(ranged=ranged, **kwargs)  # type: ignore[arg-type]


def oci_req(fake: FakeOciObjectStorage, tmp: Path, uri: str, **params: str) -> FetchRequest:
    return req(uri, tmp, auth="UserPrincipal", endpoint=fake.endpoint, **params)


def files_of(result: FetchResult) -> dict[str, str | None]:
    return {f.path: f.sha256 for f in result.files}


async def test_fetch_lists_page_by_page_and_writes_identical_files(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    model = {f"llama/f{i}.bin": os.urandom(1000 + i) for i in range(5)}
    model["llama/sub dir/a+b~c.json"] = b'{"x": 1}'
    model["llama/shards/big.bin"] = os.urandom(3 * MiB + 17)  # several ranged parts
    for name, data in model.items():
        fake.put("models", name, data)
    fake.put("models", "llama/", b"")  # a folder marker
    fake.put("models", "other/skip.bin", b"not under the prefix")
    request = oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/llama")
    result = await source(page_size=2).fetch(request)
    publish(request, result)
    for name, data in model.items():
        assert (request.dest / name.removeprefix("llama/")).read_bytes() == data
    assert files_of(result) == {k.removeprefix("llama/"): hashlib.sha256(v).hexdigest() for k, v in model.items()}
    lists = fake.operations("ListObjects")
    assert len(lists) == 4  # 8 names under the prefix (marker included), 2 a page
    assert [r.query.get("start") for r in lists] == [None, "llama/f1.bin", "llama/f3.bin", "llama/shards/big.bin"]
    assert all(r.query["fields"] == "name,size,md5,etag" and r.query["prefix"] == "llama/" for r in lists)
    assert fake.operations("GetNamespace") == []  # shape 1 names its namespace
    big_gets = [r for r in fake.operations("GetObject") if r.path.endswith("big.bin")]
    assert len(big_gets) == 4 and all(r.headers["range"].startswith("bytes=") for r in big_gets)
    assert all(r.headers.get("if-match") for r in fake.operations("GetObject"))
    assert all(r.status in (200, 206) for r in fake.requests)  # every request was signed and verified


async def test_second_fetch_with_the_manifest_is_one_listing(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    fake.put("models", "m/a.bin", os.urandom(5000))
    fake.put("models", "m/b.bin", os.urandom(7000), parts=2)  # multipart: no MD5 to adopt by
    request = oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m")
    src = source()
    files = publish(request, await src.fetch(request))
    manifest = Manifest(key="k", uid="u", storage_uri=request.storage_uri, dest=str(request.dest), files=files)
    fake.clear_requests()
    again = oci_req(fake, tmp_path, request.storage_uri)
    again.previous = manifest
    result = await src.fetch(again)
    assert result.staged == [] and files_of(result) == {f.path: f.sha256 for f in files}
    assert [r.operation for r in fake.requests] == ["ListObjects"]


async def test_unrecorded_file_in_dest_is_adopted_by_its_listed_md5(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    data = os.urandom(4000)
    fake.put("models", "m/a.bin", data)
    request = oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m")
    request.dest.mkdir(parents=True)
    (request.dest / "a.bin").write_bytes(data)
    result = await source().fetch(request)
    assert result.staged == [] and fake.operations("GetObject") == []


async def test_namespace_shapes(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    fake.put("bkt", "p/config.json", b"{}")
    src = source()
    for uri, lookups in (
        ("oci://bkt/p", 1),  # shape 3: GetNamespace, once per client
        ("oci://bkt/p", 0),
        (f"oci://{NS}@us-ashburn-1/bkt/p", 0),  # shape 2
        (f"oci://n/{NS}/b/bkt/o/p", 0),  # shape 1
    ):
        fake.clear_requests()
        result = await src.fetch(oci_req(fake, tmp_path / str(len(uri)), uri))
        assert list(files_of(result)) == ["config.json"]
        assert len(fake.operations("GetNamespace")) == lookups, uri
        assert fake.operations("ListObjects")[0].path == f"/n/{NS}/b/bkt/o"


async def test_tensorrt_llm_shape_filter(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    for shape in ("H100", "A100-80G"):
        fake.put("trt", f"engine/{shape}/rank0.engine", shape.encode())
    fake.put("trt", "engine/H100x/rank0.engine", b"not this shape")
    request = oci_req(fake, tmp_path, f"oci://n/{NS}/b/trt/o/engine")
    request.shape_alias = "H100"
    result = await source().fetch(request)
    assert list(files_of(result)) == ["H100/rank0.engine"]
    assert [r.path for r in fake.operations("GetObject")] == [f"/n/{NS}/b/trt/o/engine/H100/rank0.engine"]
    request.shape_alias = "B200"
    with pytest.raises(SourceError) as err:
        await source().fetch(request)
    assert err.value.reason == "NoObjects" and "no suitable objects found for shape B200" in err.value.message


async def test_md5_mismatch_is_verification_failed(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    fake.put("models", "m/a.bin", os.urandom(3000), claimed_md5=b64md5(b"something else"))
    request = oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m")
    with pytest.raises(SourceError) as err:
        await source().fetch(request)
    assert err.value.reason == "VerificationFailed" and "md5" in err.value.message
    assert not (request.staging / "a.bin").exists()
    # A multipart object is checked against its opc-meta-md5 when it has one.
    fake.put("models", "m/a.bin", os.urandom(3000), parts=3, metadata={"md5": b64md5(b"other")})
    with pytest.raises(SourceError) as err:
        await source().fetch(request)
    assert err.value.reason == "VerificationFailed"


async def test_missing_bucket_namespace_and_empty_prefix(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    fake.put("models", "m/a.bin", b"a")
    for uri, reason, words in (
        (f"oci://n/{NS}/b/nosuch/o/m", "BucketNotFound", "nosuch"),
        ("oci://n/othertenancy/b/models/o/m", "NamespaceNotFound", "othertenancy"),
        (f"oci://n/{NS}/b/models/o/nothing", "NoObjects", "no objects found under"),
    ):
        with pytest.raises(SourceError) as err:
            await source().fetch(oci_req(fake, tmp_path, uri))
        assert err.value.reason == reason and words in err.value.message, err.value.message


async def test_unknown_key_is_unauthorized(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    fake.put("models", "m/a.bin", b"a")
    fake.keys.clear()
    with pytest.raises(SourceError) as err:
        await source().fetch(oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m"))
    assert err.value.reason == "Unauthorized" and "opc-request-id" in err.value.message


async def test_missing_config_file_is_no_credentials(
    fake: FakeOciObjectStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OCI_CONFIG_PATH", str(tmp_path / "absent"))
    with pytest.raises(SourceError) as err:
        await source().fetch(oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m"))
    assert err.value.reason == "NoCredentials"
    assert fake.requests == []


@pytest.mark.parametrize("name", ["m/../escape.bin", "m/.cache/x.bin", "m/a//b.bin"])
async def test_unsafe_object_names_are_refused(fake: FakeOciObjectStorage, tmp_path: Path, name: str) -> None:
    fake.put("models", name, b"x")
    fake.put("models", "m/ok.bin", b"y")
    with pytest.raises(SourceError) as err:
        await source().fetch(oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m"))
    assert err.value.reason == "UnsafeFilePath" and not err.value.retryable
    assert fake.operations("GetObject") == []


async def test_cancelled_fetch_stops_and_resumes_from_its_parts(fake: FakeOciObjectStorage, tmp_path: Path) -> None:
    big = os.urandom(8 * MiB)
    fake.put("models", "m/big.bin", big)
    fake.read_chunk, fake.read_delay_s = 256 * 1024, 0.05  # about 5 MiB/s per stream
    request = oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m")
    seen: list[Progress] = []
    request.on_progress = lambda p: seen.append(Progress(**vars(p)))
    src = OciSource(ranged=RangedConfig(part_size=1 * MiB, concurrency=2, write_buffer=256 * 1024, durable=False))
    task = asyncio.create_task(src.fetch(request))

    async def some_parts_done() -> bool:
        return (request.staging / PARTS_DIR).is_dir() and any(p.completed_bytes >= 3 * MiB for p in seen)

    await eventually(some_parts_done, timeout=30, what="three MiB fetched")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)

    async def server_idle() -> bool:
        return fake.in_flight == 0

    await eventually(server_idle, timeout=10, what="the fake finished the cancelled requests")
    first_run = sum(r.sent_bytes for r in fake.operations("GetObject"))
    assert first_run < len(big)
    fake.read_delay_s = 0.0
    fake.clear_requests()
    result = await src.fetch(request)
    second_run = sum(r.sent_bytes for r in fake.operations("GetObject"))
    assert second_run <= len(big) - 2 * MiB  # the parts recorded at cancellation were not fetched again
    assert first_run + second_run <= len(big) + 2 * MiB  # at most the 2 parts in flight were fetched twice
    publish(request, result)
    assert hashlib.sha256((request.dest / "big.bin").read_bytes()).digest() == hashlib.sha256(big).digest()


async def test_session_token_profile_signs_with_the_token(
    fake: FakeOciObjectStorage, identity: UserPrincipal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("fake-session-token\n")
    config = tmp_path / "config"
    config.write_text(
        identity.config_path.read_text().replace("[DEFAULT]", "[SESSION]") + f"security_token_file={token_file}\n"
    )
    monkeypatch.setenv("OCI_CONFIG_PATH", str(config))
    monkeypatch.setenv("PROFILE", "SESSION")
    monkeypatch.setenv("USE_SESSION_TOKEN", "true")
    fake.keys = {"ST$fake-session-token": identity.public_key}  # only the session token's keyId is accepted
    fake.put("models", "m/a.bin", b"weights")
    result = await source().fetch(oci_req(fake, tmp_path, f"oci://n/{NS}/b/models/o/m"))
    assert list(files_of(result)) == ["a.bin"]
    assert all('keyId="ST$fake-session-token"' in r.headers["authorization"] for r in fake.requests)
