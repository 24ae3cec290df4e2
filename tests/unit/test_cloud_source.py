"""The gs:// and az:// source's pure parts: settings and credentials, what a probe tells, error reasons."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from multidict import CIMultiDict

from model_agent.sources.base import FetchRequest, SourceError
from model_agent.sources.cloud import (
    azure_credentials,
    classify,
    expected_from_probe,
    gcs_credentials,
    md5_from_etag,
    settings_for,
)
from model_agent.sources.objects import RemoteObject, check_paths, listed_object
from tests.support.hostile_json import DEEP

SA_KEY = json.dumps({"client_email": "a@p.iam.gserviceaccount.com", "private_key": "-----BEGIN PRIVATE KEY-----"})


def req(uri: str, secret: dict[str, str] | None = None, **params: str) -> FetchRequest:
    return FetchRequest(
        storage_uri=uri, dest=Path("/m/x"), staging=Path("/m/s"), previous=None, parameters=params, secret=secret
    )


def test_gcs_settings_from_uri_and_parameters() -> None:
    s = settings_for(req("gs://bkt/models/llama", {"serviceAccountKey": SA_KEY}, endpoint="http://127.0.0.1:4443/"))
    assert (s.scheme, s.bucket, s.prefix, s.endpoint) == ("gs", "bkt", "models/llama/", "http://127.0.0.1:4443")
    assert s.credentials == {"service_account_key": SA_KEY}
    assert SA_KEY not in repr(s)
    assert s.label("models/llama/config.json") == "gs://bkt/models/llama/config.json"
    assert s.object_url("a b/c.json") == "http://127.0.0.1:4443/bkt/a%20b/c.json"
    ambient = settings_for(req("gs://bkt"))
    assert ambient.prefix == "" and ambient.credentials == {}
    assert ambient.endpoint == "https://storage.googleapis.com" and not ambient.endpoint_given


def test_azure_settings_from_both_uri_forms() -> None:
    short = settings_for(req("az://acct/ctr/models/llama", {"accountKey": "a2V5"}))
    long = settings_for(req("az://acct.blob.core.windows.net/ctr/models/llama", {"accountKey": "a2V5"}))
    for s in (short, long):
        assert (s.scheme, s.account, s.bucket, s.prefix) == ("az", "acct", "ctr", "models/llama/")
        assert s.endpoint == "https://acct.blob.core.windows.net"
        assert s.label() == "az://acct/ctr/models/llama/"


def test_anonymous_ignores_the_secret_and_bad_parameters_are_refused() -> None:
    anon = settings_for(req("gs://bkt/m", {"serviceAccountKey": "not json"}, anonymous="true"))
    assert anon.anonymous and anon.credentials == {}
    with pytest.raises(SourceError) as err:
        settings_for(req("gs://bkt/m", endpoint="storage.example:443"))
    assert err.value.reason == "InvalidParameter" and not err.value.retryable
    for uri in ("gs:///m", "az://acct"):
        with pytest.raises(SourceError) as err:
            settings_for(req(uri))
        assert err.value.reason == "InvalidStorageUri"


def test_gcs_secret_needs_a_service_account_key() -> None:
    assert gcs_credentials(None) == {}
    assert gcs_credentials({"key.json": SA_KEY}) == {"service_account_key": SA_KEY}
    assert gcs_credentials({"GOOGLE_SERVICE_ACCOUNT_KEY": SA_KEY}) == {"service_account_key": SA_KEY}
    for data in ({"serviceAccountKey": "{not json"}, {"serviceAccountKey": '{"type": "authorized_user"}'}, {}):
        with pytest.raises(SourceError) as err:
            gcs_credentials(data)
        assert err.value.reason == "SecretInvalid"


@pytest.mark.parametrize(
    "value",
    ["[]", "1", '"x"', "null", '{"client_email": [], "private_key": ""}', DEEP],
    ids=["list", "number", "string", "null", "fields empty", "nested past any recursion limit"],
)
def test_a_service_account_key_of_the_wrong_shape_is_an_invalid_secret(value: str) -> None:
    with pytest.raises(SourceError) as err:
        gcs_credentials({"serviceAccountKey": value})
    assert err.value.reason == "SecretInvalid"


def test_azure_secret_kinds_in_order() -> None:
    assert azure_credentials(None) == {}
    assert azure_credentials({"AZURE_STORAGE_ACCOUNT_KEY": "k", "sasToken": "sv=1"}) == {"account_key": "k"}
    assert azure_credentials({"sasToken": "?sv=2023&sig=x"}) == {"sas_key": "sv=2023&sig=x"}
    principal = {"AZURE_CLIENT_ID": "i", "AZURE_CLIENT_SECRET": "s", "AZURE_TENANT_ID": "t"}
    assert azure_credentials(principal) == {"client_id": "i", "client_secret": "s", "tenant_id": "t"}
    with pytest.raises(SourceError) as err:
        azure_credentials({"clientId": "i", "clientSecret": "s"})  # no tenant
    assert err.value.reason == "SecretInvalid"


def b64md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def test_probe_of_a_gcs_object_gives_size_md5_and_etag() -> None:
    listed = RemoteObject("m/a.bin", "a.bin", 10, "etag-from-listing")
    headers = {"Content-Range": "bytes 0-0/12", "ETag": '"e1"', "x-goog-hash": f"crc32c=AAAAAA==, md5={b64md5(b'x')}"}
    got = expected_from_probe(206, headers, listed)
    assert (got.size, got.validator, got.checksums) == (12, '"e1"', {"md5": hashlib.md5(b"x").hexdigest()})
    # Real GCS sends one x-goog-hash header per algorithm; aiohttp keeps both.
    twice = CIMultiDict(
        [("Content-Range", "bytes 0-0/12"), ("X-Goog-Hash", "crc32c=AAAAAA=="), ("X-Goog-Hash", f"md5={b64md5(b'x')}")]
    )
    assert expected_from_probe(206, twice, listed).checksums == {"md5": hashlib.md5(b"x").hexdigest()}
    # A composite object has no MD5: its CRC32C (base64, big-endian) is what there is to check.
    composite = expected_from_probe(206, {"Content-Range": "bytes 0-0/12", "x-goog-hash": "crc32c=4waSgw=="}, listed)
    assert composite.checksums == {"crc32c": "e3069283"} and composite.validator == "etag-from-listing"


def test_probe_of_an_azure_blob_uses_the_whole_blob_md5() -> None:
    listed = RemoteObject("m/a.bin", "a.bin", 12, "0x1")
    ranged = {"Content-Range": "bytes 0-0/12", "Content-MD5": b64md5(b"range"), "x-ms-blob-content-md5": b64md5(b"all")}
    assert expected_from_probe(206, ranged, listed).checksums == {"md5": hashlib.md5(b"all").hexdigest()}
    # A range-less answer (200): Content-MD5 is the whole blob's.
    whole = {"Content-Length": "12", "Content-MD5": b64md5(b"all")}
    assert expected_from_probe(200, whole, listed).checksums == {"md5": hashlib.md5(b"all").hexdigest()}
    assert expected_from_probe(206, {"Content-Range": "bytes 0-0/12"}, listed).checksums == {}  # block list


def obstore_like(status: int, body: str) -> Exception:
    return Exception(
        "Generic MicrosoftAzure error: Error performing GET http://h/acct/ctr?restype=container&sig=SECRET in 5ms "
        f"- Server returned non-2xx status code: {status} Reason: {body}\n\nDebug source:\nGeneric {{ sig=SECRET }}"
    )


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (404, "<Error><Code>ContainerNotFound</Code></Error>", "BucketNotFound"),
        (500, "<Error><Code>500</Code><Message>no bucket named b</Message></Error>", "BucketNotFound"),
        (403, "<Error><Code>AuthenticationFailed</Code></Error>", "Unauthorized"),
        (403, "<Error><Code>AuthorizationFailure</Code></Error>", "AccessDenied"),
        (403, "<Error><Code>AuthorizationPermissionMismatch</Code></Error>", "AccessDenied"),
        (503, "<Error><Code>ServerBusy</Code></Error>", "RateLimited"),
        (500, "<Error><Code>InternalError</Code></Error>", "SourceError"),
    ],
)
def test_listing_errors_have_reasons_and_no_signature(status: int, body: str, reason: str) -> None:
    err = classify(obstore_like(status, body), "az://acct/ctr/m/", listing=True)
    assert err.reason == reason
    assert "SECRET" not in err.message and err.message.startswith("az://acct/ctr/m/")


def test_unreachable_and_signing_failures() -> None:
    refused = Exception("Generic GCS error: Error performing list request: HTTP error: error sending request")
    assert classify(refused, "gs://b/m/", listing=True).reason == "SourceUnreachable"
    sign = Exception("Generic GCS error: Error signing blob: Error performing POST https://iam/x:signBlob - 403")
    assert classify(sign, "gs://b/m/a", listing=False).reason == "SigningFailed"
    assert classify(obstore_like(404, "<Code>BlobNotFound</Code>"), "x", listing=False).reason == "ObjectNotFound"
    no_token = (
        "Generic GCS error: Error performing token request: Error performing GET http://169.254.169.254/"
        "computeMetadata/v1/instance/service-accounts/default/token?audience=x - Server returned non-2xx status code: "
        "403 Forbidden"
    )
    assert classify(Exception(no_token), "gs://b/m/", listing=True, ambient=True).reason == "NoCredentials"
    assert classify(Exception(no_token), "gs://b/m/", listing=True, ambient=False).reason == "Unauthorized"
    for text in (
        "Generic MicrosoftAzure error: Invalid Access Key: Invalid symbol 32, offset 3.",
        "Generic GCS error: GCP credential error: Unable to decode service account file: missing field",
    ):
        assert classify(Exception(text), "x", listing=True).reason == "SecretInvalid"


def test_listing_layout_helpers() -> None:
    assert listed_object("m/", 0, "e", "m/") is None  # folder marker
    assert listed_object("m/sub/", 0, "e", "m/") is None
    assert listed_object("m/a.bin", 3, "e", "m/") == RemoteObject("m/a.bin", "a.bin", 3, "e")
    md5 = hashlib.md5(b"x").hexdigest()
    assert md5_from_etag(f'"{md5}"') == md5  # GCS XML, S3 single part
    assert md5_from_etag(f'"{b64md5(b"x")}"') == md5  # fake-gcs-server
    assert md5_from_etag('"0x8DC1A2B3C4D5E6F"') is None and md5_from_etag('"abc-3"') is None
    for bad in ("m/../x", "m/a//b", "m/.cache/x"):
        with pytest.raises(SourceError) as err:
            check_paths([RemoteObject(bad, bad[2:], 1, "e")], lambda k: f"gs://b/{k}")
        assert err.value.reason == "UnsafeFilePath"
    with pytest.raises(SourceError) as err:
        check_paths([RemoteObject("m/a", "a", 1, "e"), RemoteObject("m/a/b", "a/b", 1, "e")], str)
    assert err.value.reason == "UnsafeFilePath"
