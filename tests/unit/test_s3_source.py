"""The S3 source's pure parts: settings from URI + parameters + Secret, and what a HEAD lets us verify."""

from __future__ import annotations

import base64
import hashlib
import threading
import zlib
from pathlib import Path

import pytest

from model_agent.sources.base import FetchRequest, SourceError
from model_agent.sources.objects import clean_staging
from model_agent.sources.s3 import (
    S3Credentials,
    _signer,
    checksums_of_answer,
    credentials_from_secret,
    expected_from_head,
    settings_for,
)
from model_agent.transfer import PARTS_DIR, part_map_name


def req(uri: str, secret: dict[str, str] | None = None, **params: str) -> FetchRequest:
    return FetchRequest(
        storage_uri=uri, dest=Path("/m/x"), staging=Path("/m/s"), previous=None, parameters=params, secret=secret
    )


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_settings_from_uri_and_parameters() -> None:
    s = settings_for(req("s3://bkt@eu-west-1/models/llama", endpoint="http://minio:9000", addressingStyle="PATH"))
    assert (s.bucket, s.prefix, s.region, s.endpoint, s.addressing_style) == (
        "bkt",
        "models/llama/",
        "eu-west-1",
        "http://minio:9000",
        "path",
    )
    assert settings_for(req("s3://bkt@eu-west-1/m/", region="us-west-2")).region == "us-west-2"  # parameter wins
    assert settings_for(req("s3://bkt")).prefix == ""  # the whole bucket
    assert settings_for(req("s3://bkt/m")).credentials is None  # the SDK's default chain
    anon = settings_for(
        req("s3://bkt/m", secret={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}, anonymous="true")
    )
    assert anon.anonymous and anon.credentials is None
    for params in ({"addressingStyle": "sideways"}, {"endpoint": "minio:9000"}):
        with pytest.raises(SourceError) as err:
            settings_for(req("s3://bkt/m", None, **params))
        assert err.value.reason == "InvalidParameter" and not err.value.retryable
    with pytest.raises(SourceError) as err:
        settings_for(req("s3://@r/m"))
    assert err.value.reason == "InvalidStorageUri"


def test_credentials_from_either_spelling() -> None:
    assert credentials_from_secret(None) is None
    upper = {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_SESSION_TOKEN": "tok"}
    assert credentials_from_secret(upper) == S3Credentials("AKIA1", "s3cr3t", "tok")
    assert credentials_from_secret({"accessKeyId": "AKIA2", "secretAccessKey": "x"}) == S3Credentials("AKIA2", "x")
    assert "x" not in repr(credentials_from_secret({"accessKeyId": "AKIA2", "secretAccessKey": "x"}))
    with pytest.raises(SourceError) as err:
        credentials_from_secret({"AWS_ACCESS_KEY_ID": "only-half"})
    assert err.value.reason == "SecretInvalid"


def test_single_part_etag_is_an_md5_and_full_checksums_count() -> None:
    data = b"weights"
    md5 = hashlib.md5(data).hexdigest()
    crc = zlib.crc32(data).to_bytes(4, "big")
    sha = hashlib.sha256(data).digest()
    head = {"ContentLength": 7, "ETag": f'"{md5}"', "ChecksumCRC32": b64(crc), "ChecksumSHA256": b64(sha)}
    got = expected_from_head(head)
    assert got.size == 7 and got.validator == f'"{md5}"'
    assert got.checksums == {"md5": md5, "crc32": crc.hex(), "sha256": sha.hex()}


def test_kms_etag_is_not_an_md5() -> None:
    head = {"ContentLength": 7, "ETag": '"0123456789abcdef0123456789abcdef"', "ServerSideEncryption": "aws:kms"}
    assert expected_from_head(head).checksums == {}


def test_multipart_object_checks() -> None:
    crc = b64(b"\x01\x02\x03\x04")
    # No type and a "-N" ETag: moto (and composite S3 checksums) give a CRC of part CRCs: not checkable.
    assert expected_from_head({"ContentLength": 9, "ETag": '"abc-5"', "ChecksumCRC32": crc}).checksums == {}
    composite = {"ContentLength": 9, "ETag": '"abc-5"', "ChecksumCRC32": crc + "-5", "ChecksumType": "COMPOSITE"}
    assert expected_from_head(composite).checksums == {}
    full = {"ContentLength": 9, "ETag": '"abc-5"', "ChecksumCRC32": crc, "ChecksumType": "FULL_OBJECT"}
    assert expected_from_head(full).checksums == {"crc32": "01020304"}
    full_c = {"ContentLength": 9, "ETag": '"abc-5"', "ChecksumCRC32C": crc, "ChecksumType": "FULL_OBJECT"}
    assert expected_from_head(full_c).checksums == {"crc32c": "01020304"}
    md5 = hashlib.md5(b"all of it").digest()
    rclone = {"ContentLength": 9, "ETag": '"abc-5"', "Metadata": {"md5chksum": b64(md5)}}
    assert expected_from_head(rclone).checksums == {"md5": md5.hex()}


def test_a_get_answer_is_read_by_the_rules_of_a_head() -> None:
    """A small object is one GET with checksum mode: its headers decide what is checked, exactly as a HEAD's would."""
    data = b"config"
    md5 = hashlib.md5(data).hexdigest()
    sha = hashlib.sha256(data).digest()
    single = checksums_of_answer(6, f'"{md5}"')
    assert single({"x-amz-checksum-sha256": b64(sha)}) == {"md5": md5, "sha256": sha.hex()}
    assert single({"x-amz-server-side-encryption": "aws:kms"}) == {}  # a KMS ETag is not an MD5
    assert single({"x-amz-server-side-encryption-customer-algorithm": "AES256"}) == {}
    multipart = checksums_of_answer(6, '"abc-2"')
    assert multipart({"x-amz-checksum-sha256": b64(sha)}) == {}  # composite unless the answer says otherwise
    assert multipart({"x-amz-checksum-sha256": b64(sha), "x-amz-checksum-type": "FULL_OBJECT"}) == {"sha256": sha.hex()}
    assert multipart({"x-amz-meta-md5chksum": b64(bytes.fromhex(md5))}) == {"md5": md5}


def test_staging_keeps_only_what_this_fetch_produces(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    (staging / "shards").mkdir(parents=True)
    (staging / "old").mkdir()
    (staging / PARTS_DIR).mkdir(parents=True)
    (staging / "shards" / "a.bin").write_bytes(b"partial")
    (staging / "old" / "gone.bin").write_bytes(b"stale")
    (staging / PARTS_DIR / part_map_name("shards/a.bin")).write_text("{}")
    (staging / PARTS_DIR / part_map_name("old/gone.bin")).write_text("{}")
    (staging / ".cache" / "huggingface").mkdir()
    (staging / ".cache" / "huggingface" / "x.lock").write_text("")
    clean_staging(staging, {"shards/a.bin", "config.json"})
    left = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    assert left == [f"{PARTS_DIR.as_posix()}/{part_map_name('shards/a.bin')}", "shards/a.bin"]
    assert not (staging / "old").exists()


@pytest.mark.parametrize(
    ("secret", "params", "in_the_loop"),
    [
        (None, {"anonymous": "true"}, True),  # unsigned: nothing to refresh
        ({"AWS_ACCESS_KEY_ID": "AKIAX", "AWS_SECRET_ACCESS_KEY": "k"}, {}, True),  # a Secret's keys never refresh
        (None, {}, False),  # the SDK's chain may refresh temporary credentials over the network first
    ],
)
async def test_urls_are_signed_in_the_event_loop_unless_credentials_may_refresh(
    secret: dict[str, str] | None, params: dict[str, str], in_the_loop: bool
) -> None:
    signed_in: list[int] = []

    def presign(key: str) -> str:
        signed_in.append(threading.get_ident())
        return f"https://store.example/{key}"

    sign = _signer(presign, settings_for(req("s3://bucket/prefix", secret, **params)))
    assert await sign("a/b") == "https://store.example/a/b"
    assert (signed_in == [threading.get_ident()]) is in_the_loop
