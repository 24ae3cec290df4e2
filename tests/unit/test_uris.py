"""Storage URI detection and parsing (docs/ome-compatibility.md#21-type-detection, 2.2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_agent.model.uris import (
    AzureUri,
    GcsUri,
    GithubUri,
    HfUri,
    InvalidStorageUri,
    LocalUri,
    OciUri,
    PvcUri,
    S3Uri,
    StorageType,
    VendorUri,
    parse_azure_uri,
    parse_gcs_uri,
    parse_github_uri,
    parse_hf_uri,
    parse_local_uri,
    parse_oci_uri,
    parse_pvc_uri,
    parse_s3_uri,
    parse_storage_uri,
    parse_vendor_uri,
    storage_type,
)


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        ("oci://n/ns/b/bkt/o/p", StorageType.OCI),
        ("pvc://claim/sub", StorageType.PVC),
        ("vendor://v/t/p", StorageType.VENDOR),
        ("hf://Qwen/Qwen3-8B", StorageType.HUGGINGFACE),
        ("s3://bucket/p", StorageType.S3),
        ("az://acct/c/p", StorageType.AZURE),
        ("gs://bucket/o", StorageType.GCS),
        ("github://o/r", StorageType.GITHUB),
        ("local:///raid/x", StorageType.LOCAL),
    ],
)
def test_storage_type_by_prefix(uri: str, kind: StorageType) -> None:
    assert storage_type(uri) is kind
    assert kind.value in {"OCI", "PVC", "VENDOR", "HUGGINGFACE", "S3", "AZURE", "GCS", "GITHUB", "LOCAL"}


@pytest.mark.parametrize("uri", ["", "http://x", "HF://Qwen/Qwen3-8B", "hf:/x", " hf://x/y", "modelpack://r/x"])
def test_unknown_storage_type(uri: str) -> None:
    with pytest.raises(InvalidStorageUri, match="unknown storage type for URI"):
        storage_type(uri)


class TestHuggingFace:
    @pytest.mark.parametrize(
        ("uri", "expected"),
        [
            ("hf://Qwen/Qwen3-8B", HfUri("Qwen/Qwen3-8B", "main")),
            ("hf://my-org/private-llm@v1.2", HfUri("my-org/private-llm", "v1.2")),
            ("hf://gpt2", HfUri("gpt2", "main")),
            ("hf://org/model@refs/pr/1", HfUri("org/model", "refs/pr/1")),
            (
                "hf://org/model@0e9e39f249a16976918f6564b8830bc894c89659",
                HfUri("org/model", "0e9e39f249a16976918f6564b8830bc894c89659"),
            ),
            ("hf://meta-llama/Llama-3.1-8B_x", HfUri("meta-llama/Llama-3.1-8B_x", "main")),
        ],
    )
    def test_valid(self, uri: str, expected: HfUri) -> None:
        assert parse_hf_uri(uri) == expected

    @pytest.mark.parametrize(
        "uri",
        [
            "hf://",
            "hf://@main",
            "hf://org/",
            "hf:///model",
            "hf://org//model",
            "hf://a/b/c",
            "hf://../etc",
            "hf://org/..",
            "hf://org/a..b",
            "hf://org/a--b",
            "hf://org/.hidden",
            "hf://org/model-",
            "hf://org/model?revision=x",
            "hf://org/mo del",
            "hf://org/model\n",
            "hf://org/model\x00",
            "hf://org/modél",
            "hf://org/model@../x",
            "hf://org/model@a//b",
            "hf://org/model@/abs",
            "hf://org/model@x#y",
            "hf://org/model@x%2F",
            "hf://" + "a" * 97,
        ],
    )
    def test_invalid(self, uri: str) -> None:
        with pytest.raises(InvalidStorageUri) as info:
            parse_hf_uri(uri)
        assert info.value.reason == str(info.value)
        assert "Hugging Face" in info.value.reason or "control" in info.value.reason


class TestOci:
    @pytest.mark.parametrize(
        ("uri", "expected"),
        [
            (
                "oci://n/mytenancy/b/models/o/meta/llama-3.1-8b-instruct",
                OciUri("mytenancy", "models", "meta/llama-3.1-8b-instruct/"),
            ),
            ("oci://n/ns/b/bkt/o/dir/", OciUri("ns", "bkt", "dir/")),
            ("oci://ns@us-ashburn-1/bkt/a/b", OciUri("ns", "bkt", "a/b/", "us-ashburn-1")),
            ("oci://bkt/a/b", OciUri("", "bkt", "a/b/")),
            ("oci://bkt/dir@v2/x", OciUri("", "bkt", "dir@v2/x/")),
        ],
    )
    def test_valid(self, uri: str, expected: OciUri) -> None:
        assert parse_oci_uri(uri) == expected

    @pytest.mark.parametrize(
        "uri",
        [
            "oci://",
            "oci://n/ns/b/bkt",
            "oci://n/ns/x/bkt/o/p",
            "oci://n/ns/b/bkt/x/p",
            "oci://n/ns/b//o/p",
            "oci://n/ns/b/bkt/o",  # empty prefix: OME turns it into "/" which matches nothing
            "oci://n/ns/b/bkt/o/",
            "oci://bkt",
            "oci://bkt/",
            "oci:///p",
            "oci://ns@r",
            "oci://ns@r/bkt",
            "oci://bkt/p\tq",
        ],
    )
    def test_invalid(self, uri: str) -> None:
        with pytest.raises(InvalidStorageUri):
            parse_oci_uri(uri)


class TestOtherSchemes:
    def test_s3(self) -> None:
        assert parse_s3_uri("s3://bucket/models/x") == S3Uri("bucket", "", "models/x")
        assert parse_s3_uri("s3://bucket@eu-west-1/models/x") == S3Uri("bucket", "eu-west-1", "models/x")
        assert parse_s3_uri("s3://bucket") == S3Uri("bucket", "", "")
        assert parse_s3_uri("s3://bucket/a@b") == S3Uri("bucket", "", "a@b")
        for bad in ("s3://", "s3:///x", "s3://@r/x", "s3://b@/x"):
            with pytest.raises(InvalidStorageUri):
                parse_s3_uri(bad)

    def test_gcs(self) -> None:
        assert parse_gcs_uri("gs://bucket/dir/obj") == GcsUri("bucket", "dir/obj")
        assert parse_gcs_uri("gs://bucket") == GcsUri("bucket", "")
        with pytest.raises(InvalidStorageUri):
            parse_gcs_uri("gs:///obj")

    def test_azure(self) -> None:
        assert parse_azure_uri("az://acct.blob.core.windows.net/c/p/q") == AzureUri("acct", "c", "p/q")
        assert parse_azure_uri("az://acct/c/p/q") == AzureUri("acct", "c", "p/q")
        assert parse_azure_uri("az://acct/c") == AzureUri("acct", "c", "")
        for bad in ("az://", "az://acct", "az://acct/", "az:///c/p", "az://.blob.core.windows.net/c"):
            with pytest.raises(InvalidStorageUri):
                parse_azure_uri(bad)

    def test_pvc(self) -> None:
        assert parse_pvc_uri("pvc://claim/models/x") == PvcUri("", "claim", "models/x")
        assert parse_pvc_uri("pvc://team-a:claim/x") == PvcUri("team-a", "claim", "x")
        for bad in (
            "pvc://",
            "pvc://claim",
            "pvc://claim/",
            "pvc:///x",
            "pvc://:claim/x",
            "pvc://ns:/x",
            "pvc://a:b:c/x",
            "pvc://Team:claim/x",
            "pvc://-ns:claim/x",
            "pvc://" + "n" * 64 + ":claim/x",
            "pvc://claim/a/../b",
        ):
            with pytest.raises(InvalidStorageUri):
                parse_pvc_uri(bad)

    def test_local(self) -> None:
        assert parse_local_uri("local:///raid/x") == LocalUri("/raid/x")
        assert parse_local_uri("local://x") == LocalUri("x")
        assert parse_local_uri("local:///mnt/my models") == LocalUri("/mnt/my models")
        assert parse_oci_uri("oci://bkt/my models/x") == OciUri("", "bkt", "my models/x/")
        for bad in ("local://", "local:///a\x00b", "local:///a\x7fb", "local:///a\rb"):
            with pytest.raises(InvalidStorageUri):
                parse_local_uri(bad)

    def test_vendor(self) -> None:
        assert parse_vendor_uri("vendor://acme/llm/a/b") == VendorUri("acme", "llm", "a/b")
        for bad in ("vendor://", "vendor://a/b", "vendor://a//c", "vendor:///b/c", "vendor://a/b/"):
            with pytest.raises(InvalidStorageUri):
                parse_vendor_uri(bad)

    def test_github(self) -> None:
        assert parse_github_uri("github://o/r") == GithubUri("o", "r", "latest")
        assert parse_github_uri("github://o/r@v1") == GithubUri("o", "r", "v1")
        for bad in (
            "github://",
            "github://o",
            "github://o/",
            "github:///r",
        ):
            with pytest.raises(InvalidStorageUri):
                parse_github_uri(bad)

    def test_wrong_prefix_for_parser(self) -> None:
        with pytest.raises(InvalidStorageUri, match="does not start with hf://"):
            parse_hf_uri("s3://bucket/x")


def test_dispatch() -> None:
    assert parse_storage_uri("hf://Qwen/Qwen3-8B") == HfUri("Qwen/Qwen3-8B")
    assert parse_storage_uri("oci://bkt/a") == OciUri("", "bkt", "a/")
    assert parse_storage_uri("local:///x") == LocalUri("/x")
    assert parse_storage_uri("vendor://a/b/c") == VendorUri("a", "b", "c")
    with pytest.raises(InvalidStorageUri):
        parse_storage_uri("ftp://x")


def test_messages_are_bounded_and_escaped() -> None:
    with pytest.raises(InvalidStorageUri) as info:
        parse_storage_uri("hf://org/x\n" + "y" * 1000)
    assert "\n" not in info.value.reason
    assert len(info.value.reason) < 400


@settings(max_examples=200, deadline=None)
@given(uri=st.text(max_size=80) | st.from_regex(r"(hf|oci|s3|gs|az|pvc|local|vendor|github)://.{0,40}"))
def test_parsing_raises_only_invalid_storage_uri(uri: str) -> None:
    try:
        parse_storage_uri(uri)
    except InvalidStorageUri as exc:
        assert exc.reason
