"""Golden vectors for storage URIs: every form, its parse or its refusal.

``ACCEPTED`` lists URIs with the value the parser must return. Where OME's Go parser accepts the same URI
and downloads it, the split (bucket, prefix, namespace, revision...) is OME's. ``REFUSED`` lists URIs
with a fragment the refusal reason must contain: for a form OME's parser accepts but cannot download
(or misreads), the fragment is the "write ... instead" part, so the reason tells the author the fix.
``docs/ome-compatibility.md`` (sections 2.2 and 17) describes the same table in prose.
"""

from __future__ import annotations

import pytest

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
    StorageUri,
    VendorUri,
    parse_storage_uri,
    storage_type,
)

ACCEPTED: list[tuple[str, StorageUri]] = [
    # --- Hugging Face: repository before the first "@", revision after it; none means main.
    ("hf://Qwen/Qwen3-8B", HfUri("Qwen/Qwen3-8B", "main")),
    ("hf://gpt2", HfUri("gpt2", "main")),
    ("hf://my-org/private-llm@v1.2", HfUri("my-org/private-llm", "v1.2")),
    ("hf://org/model@refs/pr/1", HfUri("org/model", "refs/pr/1")),
    (
        "hf://org/model@0e9e39f249a16976918f6564b8830bc894c89659",
        HfUri("org/model", "0e9e39f249a16976918f6564b8830bc894c89659"),
    ),
    ("hf://org/model@", HfUri("org/model", "main")),  # OME: branch "", which the hub reads as the default
    ("hf://gpt2@", HfUri("gpt2", "main")),
    ("hf://org/model@feature/x", HfUri("org/model", "feature/x")),
    ("hf://org/model@v1@2", HfUri("org/model", "v1@2")),  # split at the first "@", as OME
    ("hf://_org/m.v2_x", HfUri("_org/m.v2_x", "main")),
    # --- OCI: three shapes; prefix as a folder; empty namespace looked up; empty region = parameter.
    ("oci://n/tenancy/b/models/o/meta/llama-3.1-8b", OciUri("tenancy", "models", "meta/llama-3.1-8b/")),
    ("oci://n/ns/b/bkt/o/dir/", OciUri("ns", "bkt", "dir/")),
    ("oci://n/ns/b/bkt/o/a/b/c", OciUri("ns", "bkt", "a/b/c/")),
    ("oci://n//b/bkt/o/p", OciUri("", "bkt", "p/")),  # OME: namespace "", looked up like shape 3
    ("oci://n/ns/b/bkt/o/dir@x/more", OciUri("ns", "bkt", "dir@x/more/")),
    ("oci://ns@us-ashburn-1/bkt/a/b", OciUri("ns", "bkt", "a/b/", "us-ashburn-1")),
    ("oci://@us-ashburn-1/bkt/p", OciUri("", "bkt", "p/", "us-ashburn-1")),  # OME: namespace "", region kept
    ("oci://ns@/bkt/p", OciUri("ns", "bkt", "p/", "")),  # OME: region "" (the region parameter decides)
    ("oci://ns@r/bkt/dir@x", OciUri("ns", "bkt", "dir@x/", "r")),
    ("oci://bkt/a/b", OciUri("", "bkt", "a/b/")),
    ("oci://bkt/p/", OciUri("", "bkt", "p/")),
    ("oci://bkt/my models/x", OciUri("", "bkt", "my models/x/")),
    # Deliberate: "@" outside the first segment is part of the prefix. OME splits at the first "@"
    # anywhere (namespace "bkt/dir", region "x", bucket "more", no prefix) and cannot download it.
    ("oci://bkt/dir@x/more", OciUri("", "bkt", "dir@x/more/")),
    # A bucket with a dot is still Object Storage when the path reads as no registry reference (no tag).
    ("oci://my.bucket/models/llama", OciUri("", "my.bucket", "models/llama/")),
    ("oci://registry.example/org/model", OciUri("", "registry.example", "org/model/")),
    # --- ocios://: OME's newer, unambiguous spelling of the same three Object Storage shapes.
    ("ocios://n/tenancy/b/models/o/meta/llama-3.1-8b", OciUri("tenancy", "models", "meta/llama-3.1-8b/")),
    ("ocios://ns@us-ashburn-1/bkt/a/b", OciUri("ns", "bkt", "a/b/", "us-ashburn-1")),
    ("ocios://bkt/a/b", OciUri("", "bkt", "a/b/")),
    ("ocios://my.bucket/org/model:v1", OciUri("", "my.bucket", "org/model:v1/")),  # ocios: never a registry
    # --- S3 / GCS / Azure.
    ("s3://bucket/models/x", S3Uri("bucket", "", "models/x")),
    ("s3://bucket@eu-west-1/models/x", S3Uri("bucket", "eu-west-1", "models/x")),
    ("s3://bucket", S3Uri("bucket", "", "")),
    # Deliberate: OME reads bucket "bucket/a", region "b" (not a valid bucket; it never fetches s3://).
    ("s3://bucket/a@b", S3Uri("bucket", "", "a@b")),
    ("gs://bucket/dir/obj", GcsUri("bucket", "dir/obj")),
    ("gs://bucket", GcsUri("bucket", "")),
    ("az://acct.blob.core.windows.net/c/p/q", AzureUri("acct", "c", "p/q")),
    ("az://acct/c/p/q", AzureUri("acct", "c", "p/q")),
    ("az://acct/c", AzureUri("acct", "c", "")),
    # --- GitHub: OME's split exactly (nothing is fetched: UnsupportedStorage).
    ("github://o/r", GithubUri("o", "r", "latest")),
    ("github://o/r@v1", GithubUri("o", "r", "v1")),
    ("github://o/r@", GithubUri("o", "r", "")),
    ("github://o/r/x", GithubUri("o", "r/x", "latest")),
    ("github://o/r/x@v1", GithubUri("o", "r/x", "v1")),
    ("github://o/r/", GithubUri("o", "r/", "latest")),
    ("github://o/r@v1@v2", GithubUri("o", "r", "v1@v2")),
    ("github://o/r@v1/x", GithubUri("o", "r", "v1/x")),
    ("github://o//r", GithubUri("o", "/r", "latest")),
    # --- PVC / local / vendor.
    ("pvc://claim/models/x", PvcUri("", "claim", "models/x")),
    ("pvc://team-a:claim/x", PvcUri("team-a", "claim", "x")),
    ("pvc://claim//x", PvcUri("", "claim", "/x")),
    ("pvc://claim/./x", PvcUri("", "claim", "./x")),
    ("local:///raid/x", LocalUri("/raid/x")),
    ("local:///mnt/my models", LocalUri("/mnt/my models")),
    ("vendor://acme/llm/a/b", VendorUri("acme", "llm", "a/b")),
]

REFUSED: list[tuple[str, str]] = [
    # --- Hugging Face forms OME accepts and the hub cannot serve (or that escape paths).
    ("hf://", "write hf://{owner}/{name}[@{revision}]"),
    ("hf://@main", "write hf://{owner}/{name}[@{revision}]"),
    ("hf://a/b/c", "of 3 path segments"),
    ("hf://a/b/c@main", "write hf://{owner}/{name}[@{revision}]"),
    ("hf://org/model/tree/main", "of 4 path segments"),
    ("hf://org/", "empty path segment"),
    ("hf://org/model/", "empty path segment"),
    ("hf:///model", "empty path segment"),
    ("hf://org//model", "empty path segment"),
    ("hf://../etc", "write the id as the hub shows it"),
    ("hf://org/..", "write the id as the hub shows it"),
    ("hf://org/a..b", "without '..' or '--'"),
    ("hf://org/a--b", "without '..' or '--'"),
    ("hf://org/.hidden", "write the id as the hub shows it"),
    ("hf://org/model-", "write the id as the hub shows it"),
    ("hf://org/model.", "write the id as the hub shows it"),
    ("hf://org/model?revision=x", "write the id as the hub shows it"),
    ("hf://org/mo del", "write the id as the hub shows it"),
    ("hf://org/model ", "write the id as the hub shows it"),
    ("hf://org/modél", "write the id as the hub shows it"),
    ("hf://" + "a" * 97, "write the id as the hub shows it"),
    ("hf://org/model@../x", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model@a//b", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model@/abs", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model@x/", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model@x#y", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model@x?y", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model@x%2F", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model@a\\b", "write a branch, a tag, a commit id or refs/pr/{N}"),
    ("hf://org/model\n", "control characters"),
    ("hf://org/model\x00", "control characters"),
    # --- OCI: a container-registry reference (a ModelPack artifact) is not fetched here: UnsupportedStorageUri.
    ("oci://registry.example/org/model:v1", "for OCI Object Storage write ocios://n/{namespace}/b/{bucket}/o/"),
    ("oci://registry.example:5000/org/team/model:2026-01", "names an image in a container registry"),
    ("oci://localhost/model:latest", "names an image in a container registry"),
    ("oci://registry.example/org/model@sha256:" + "ab" * 32, "names an image in a container registry"),
    ("ocios://bkt", "name the folder that holds the model"),
    # --- OCI: an empty prefix becomes "/" in OME, which lists nothing.
    ("oci://bkt", "name the folder that holds the model, oci://n/{namespace}/b/bkt/o/{folder}"),
    ("oci://bkt/", "OME would list objects under '/' and find none"),
    ("oci://bkt//", "name the folder that holds the model"),
    ("oci://n", "name the folder that holds the model"),
    ("oci://n/ns/b/bkt/o", "name the folder that holds the model"),
    ("oci://n/ns/b/bkt/o/", "name the folder that holds the model"),
    ("oci://n/ns/b/bkt/o//", "name the folder that holds the model"),
    ("oci://ns@r/bkt", "name the folder that holds the model"),
    ("oci://ns@r/bkt/", "name the folder that holds the model"),
    ("oci://bkt@x/p", "name the folder that holds the model"),  # namespace "bkt", bucket "p", as OME
    ("oci://", "no bucket name"),
    ("oci:///p", "no bucket name"),
    ("oci://ns@r", "no bucket name"),
    ("oci://ns@r/", "no bucket name"),
    ("oci://n/ns/b//o/p", "no bucket name"),
    ("oci://n/ns/b/bkt", "expected oci://n/{namespace}/b/{bucket}/o/{prefix}"),
    ("oci://n/ns/x/bkt/o/p", "expected oci://n/{namespace}/b/{bucket}/o/{prefix}"),
    ("oci://n/ns/b/bkt/x/p", "expected oci://n/{namespace}/b/{bucket}/o/{prefix}"),
    ("oci://bkt/p\tq", "control characters"),
    # --- S3 / GCS / Azure.
    ("s3://", "no bucket name"),
    ("s3:///x", "no bucket name"),
    ("s3://@r/x", "no bucket name"),
    ("s3://b@/x", "empty region"),
    ("gs:///obj", "no bucket name"),
    ("az://acct", "needs an account and a container"),
    ("az://acct/", "needs an account and a container"),
    ("az:///c/p", "needs an account and a container"),
    # --- GitHub: the forms OME refuses too.
    ("github://", "write github://{owner}/{repository}[@{tag}]"),
    ("github://o", "write github://{owner}/{repository}[@{tag}]"),
    ("github://o/", "write github://{owner}/{repository}[@{tag}]"),
    ("github:///r", "write github://{owner}/{repository}[@{tag}]"),
    ("github://o/@v1", "write github://{owner}/{repository}[@{tag}]"),
    ("github://o@v1/r", "write github://{owner}/{repository}[@{tag}]"),
    # --- PVC: "..", which Kubernetes refuses as a subPath (OME accepts it), and OME's own refusals.
    ("pvc://claim/a/../b", "name the directory inside the volume directly"),
    ("pvc://claim/..", "name the directory inside the volume directly"),
    ("pvc://claim/../x", "name the directory inside the volume directly"),
    ("pvc://", "has no sub-path"),
    ("pvc://claim", "has no sub-path"),
    ("pvc://claim/", "has no sub-path"),
    ("pvc:///x", "has no PVC name"),
    ("pvc://:claim/x", "invalid namespace"),
    ("pvc://ns:/x", "has no PVC name"),
    ("pvc://a:b:c/x", "more than one ':'"),
    ("pvc://Team:claim/x", "invalid namespace"),
    # --- Local, vendor, unknown.
    ("local://", "has no path"),
    ("vendor://a/b", "expected vendor://{vendor}/{resource-type}/{path}"),
    ("ftp://x", "unknown storage type"),
    ("HF://Qwen/Qwen3-8B", "unknown storage type"),
]


@pytest.mark.parametrize(("uri", "expected"), ACCEPTED, ids=[u for u, _ in ACCEPTED])
def test_accepted(uri: str, expected: StorageUri) -> None:
    assert parse_storage_uri(uri) == expected


@pytest.mark.parametrize(("uri", "fragment"), REFUSED, ids=[repr(u) for u, _ in REFUSED])
def test_refused_with_a_reason(uri: str, fragment: str) -> None:
    with pytest.raises(InvalidStorageUri) as info:
        parse_storage_uri(uri)
    assert fragment in info.value.reason
    assert "\n" not in info.value.reason


def test_tables_do_not_overlap() -> None:
    accepted = [u for u, _ in ACCEPTED]
    refused = [u for u, _ in REFUSED]
    assert len(set(accepted)) == len(accepted)
    assert len(set(refused)) == len(refused)
    assert not set(accepted) & set(refused)


@pytest.mark.parametrize(
    ("uri", "code"),
    [
        ("oci://registry.example/org/model:v1", "UnsupportedStorageUri"),
        ("oci://bkt", "InvalidStorageUri"),
        ("ocios://bkt", "InvalidStorageUri"),
    ],
)
def test_a_registry_reference_is_unsupported_not_malformed(uri: str, code: str) -> None:
    with pytest.raises(InvalidStorageUri) as raised:
        parse_storage_uri(uri)
    assert raised.value.code == code
    assert storage_type(uri) == StorageType.OCI
