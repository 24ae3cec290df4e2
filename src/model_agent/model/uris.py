"""Storage URIs of ``spec.storage.storageUri`` (docs/ome-compatibility.md#21-type-detection, 2.2): type detection and
one parser per scheme.

Role: turn the URI string into a small frozen value the sources layer can use, or into one clear
error. :class:`InvalidStorageUri` is the only exception raised; its message is written for humans
because it becomes the ``Failed`` reason of the model (ConfigMap entry, Event, log).

Contract:

* :func:`storage_type` tests the prefixes in OME's order (``oci://``, ``ocios://``, ``pvc://``, ``vendor://``,
  ``hf://``, ``s3://``, ``az://``, ``gs://``, ``github://``, ``local://``); prefixes are case-sensitive.
  :class:`UnsupportedStorageUri` (a subclass) marks a well-formed URI of a kind not fetched here.
* Each ``parse_*`` accepts what OME's parser accepts *and OME then downloads correctly*, and splits it the
  same way (bucket, prefix, revision); :func:`parse_storage_uri` dispatches on the type. A form OME
  accepts but cannot use (it lists nothing, asks the hub for a repository that cannot exist, or misreads
  an ``@``) is refused here, and the reason says what to write instead.
  ``tests/unit/test_uri_golden.py`` is the table of every form and its parse or refusal.
* Stricter than OME, everywhere: a URI containing an ASCII control character (NUL, CR, LF, TAB, DEL
  ...) is rejected — such a value can only be a mistake and would end up in URLs, object names, log
  lines or file paths. Spaces are allowed where the scheme allows them (object prefixes, local paths).
  Further strictness is listed on each parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from model_agent.model.errors import ReasonError


class InvalidStorageUri(ReasonError):
    """A storage URI that cannot be used; ``reason`` is a complete human-readable sentence."""

    code = "InvalidStorageUri"  # the Failed reason's first word


class UnsupportedStorageUri(InvalidStorageUri):
    """A well-formed URI of a kind this agent does not fetch (yet): an OCI registry reference."""

    code = "UnsupportedStorageUri"


class StorageType(StrEnum):
    """Backend selected by the URI prefix; values are OME's ``StorageType`` strings."""

    OCI = "OCI"
    PVC = "PVC"
    VENDOR = "VENDOR"
    HUGGINGFACE = "HUGGINGFACE"
    S3 = "S3"
    AZURE = "AZURE"
    GCS = "GCS"
    GITHUB = "GITHUB"
    LOCAL = "LOCAL"


# Order matters only for documentation parity with OME; no prefix is a prefix of another.
_PREFIXES: Final[tuple[tuple[str, StorageType], ...]] = (
    ("oci://", StorageType.OCI),
    ("ocios://", StorageType.OCI),  # OCI Object Storage, unambiguous (OME's newer spelling)
    ("pvc://", StorageType.PVC),
    ("vendor://", StorageType.VENDOR),
    ("hf://", StorageType.HUGGINGFACE),
    ("s3://", StorageType.S3),
    ("az://", StorageType.AZURE),
    ("gs://", StorageType.GCS),
    ("github://", StorageType.GITHUB),
    ("local://", StorageType.LOCAL),
)
_PREFIX_OF: Final = {kind: prefix for prefix, kind in reversed(_PREFIXES)}  # (OCI: oci://, the first)
# An OCI registry reference: a registry host (a dot, a port or localhost), a repository, a tag or a digest.
_REGISTRY_REFERENCE: Final = re.compile(
    r"(?:[^/]*[.:][^/]*|localhost)/[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})"
)

_HF_DEFAULT_REVISION: Final = "main"
_GITHUB_DEFAULT_TAG: Final = "latest"
_AZURE_BLOB_HOST: Final = ".blob.core.windows.net/"

_FORBIDDEN_CHARS: Final = re.compile(r"[\x00-\x1f\x7f]")
# huggingface_hub's repo-id rule: letters, digits, "_", "-", "."; a part starts and ends with a
# letter, digit or "_"; at most 96 characters per part.
_HF_REPO_PART: Final = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,94}[A-Za-z0-9_])?")
_HF_REVISION_FORBIDDEN: Final = re.compile(r"[?#%\\]")
_K8S_NAMESPACE: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class HfUri:
    """``hf://{repo_id}[@{revision}]``; ``revision`` is a branch, tag, commit or ``refs/...`` path."""

    repo_id: str
    revision: str = _HF_DEFAULT_REVISION


@dataclass(frozen=True, slots=True)
class OciUri:
    """OCI Object Storage location; ``prefix`` always ends in ``/``.

    ``namespace`` is ``""`` when it must be looked up at first use. ``region`` is parsed from
    ``namespace@region`` but OME ignores it (the ``region`` parameter wins).
    """

    namespace: str
    bucket: str
    prefix: str
    region: str = ""


@dataclass(frozen=True, slots=True)
class S3Uri:
    """``s3://{bucket}[@{region}]/{prefix}``; ``prefix`` may be empty (whole bucket)."""

    bucket: str
    region: str
    prefix: str


@dataclass(frozen=True, slots=True)
class GcsUri:
    """``gs://{bucket}/{object}``; ``object`` may be empty."""

    bucket: str
    object: str


@dataclass(frozen=True, slots=True)
class AzureUri:
    """``az://{account}.blob.core.windows.net/{container}/{blob}`` or ``az://{account}/{container}/{blob}``."""

    account: str
    container: str
    blob_path: str


@dataclass(frozen=True, slots=True)
class PvcUri:
    """``pvc://[{namespace}:]{pvc_name}/{sub_path}``; ``namespace`` is ``""`` when not given."""

    namespace: str
    pvc_name: str
    sub_path: str


@dataclass(frozen=True, slots=True)
class LocalUri:
    """``local://{path}``; the path verbatim (``local:///raid/x`` -> ``/raid/x``)."""

    path: str


@dataclass(frozen=True, slots=True)
class VendorUri:
    """``vendor://{vendor}/{resource_type}/{resource_path}``; nothing is downloaded for it."""

    vendor: str
    resource_type: str
    resource_path: str


@dataclass(frozen=True, slots=True)
class GithubUri:
    """``github://{owner}/{repo}[@{tag}]``; ``tag`` defaults to ``latest`` (``""`` after a bare ``@``)."""

    owner: str
    repo: str
    tag: str = _GITHUB_DEFAULT_TAG


StorageUri = HfUri | OciUri | S3Uri | GcsUri | AzureUri | PvcUri | LocalUri | VendorUri | GithubUri


def storage_type(uri: str) -> StorageType:
    """Backend type by prefix; :class:`InvalidStorageUri` for an unknown scheme."""
    for prefix, kind in _PREFIXES:
        if uri.startswith(prefix):
            return kind
    raise InvalidStorageUri(f"unknown storage type for URI: {_shown(uri)}")


def parse_storage_uri(uri: str) -> StorageUri:
    """Parse ``uri`` with the parser of its type."""
    return _PARSERS[storage_type(uri)](uri)


def parse_hf_uri(uri: str) -> HfUri:
    """Parse ``hf://{repo_id}[@{revision}]``; no revision (no ``@``, or nothing after it) means ``main``.

    Like OME, everything before the first ``@`` is the repository and everything after it the revision;
    a trailing ``@`` with nothing after it is the default branch, as the hub's clients read an empty
    revision. Stricter than OME (which only requires a non-empty id and then fails at the hub):

    * the repo id is ``name`` or ``owner/name``, each part made of ASCII letters, digits, ``_``, ``-``,
      ``.``, starting and ending with a letter, digit or ``_``, at most 96 characters, with no ``..``
      and no ``--`` — huggingface_hub's own rule, so a rejected id could never have been downloaded; in
      particular an empty id, ``..`` segments, empty segments and query strings are refused;
    * a revision may not contain ``..`` or empty path segments, nor ``?``, ``#``, ``%`` or ``\\`` — it is
      placed raw in URL paths.
    """
    rest = _remainder(uri, StorageType.HUGGINGFACE)
    repo_id, at, revision = rest.partition("@")
    if not repo_id:
        raise InvalidStorageUri(
            f"Hugging Face URI {_shown(uri)} has an empty repository id: write hf://{{owner}}/{{name}}[@{{revision}}]"
        )
    parts = repo_id.split("/")
    if "" in parts:
        raise InvalidStorageUri(
            f"Hugging Face URI {_shown(uri)} has an invalid repository id {repo_id!r} with an empty path segment "
            "(a leading, doubled or trailing '/'): write hf://{owner}/{name}[@{revision}]"
        )
    if len(parts) > 2:
        raise InvalidStorageUri(
            f"Hugging Face URI {_shown(uri)} has an invalid repository id {repo_id!r} of {len(parts)} path "
            "segments, but a repository id is 'name' or 'owner/name' (the hub has no deeper repositories): "
            "write hf://{owner}/{name}[@{revision}]"
        )
    if not all(_HF_REPO_PART.fullmatch(part) for part in parts) or ".." in repo_id or "--" in repo_id:
        raise InvalidStorageUri(
            f"Hugging Face URI {_shown(uri)} has an invalid repository id {repo_id!r}, which the hub would "
            "refuse: write the id as the hub shows it, 'name' or 'owner/name' made of letters, digits, '_', "
            "'-' and '.', starting and ending with a letter or digit, without '..' or '--'"
        )
    if not at or not revision:
        return HfUri(repo_id, _HF_DEFAULT_REVISION)
    if _HF_REVISION_FORBIDDEN.search(revision) or any(seg in ("", "..") for seg in revision.split("/")):
        raise InvalidStorageUri(
            f"Hugging Face URI {_shown(uri)} has an invalid revision {revision!r}: it may not contain '..', "
            "empty path segments, '?', '#', '%' or '\\'; write a branch, a tag, a commit id or refs/pr/{N}"
        )
    return HfUri(repo_id, revision)


def parse_oci_uri(uri: str) -> OciUri:
    """Parse the three OCI Object Storage shapes; the prefix is normalised to end with ``/``.

    ``ocios://`` takes the same three shapes as ``oci://`` (OME's newer, unambiguous spelling for Object Storage).
    An ``oci://`` URI that reads as a container-registry reference (``oci://registry.example/org/model:v1``,
    ``...@sha256:<hex>``: a host with a dot, a port or ``localhost``, then a repository and a tag or digest) is
    refused with :class:`UnsupportedStorageUri`: OME is moving ``oci://`` to mean a ModelPack artifact in a
    registry, which this agent does not fetch.

    1. ``oci://n/{namespace}/b/{bucket}/o/{prefix...}`` (chosen when the rest starts with ``n/``);
    2. ``oci://{namespace}@{region}/{bucket}/{prefix...}``;
    3. ``oci://{bucket}/{prefix...}`` (namespace looked up at first use).

    As in OME, an empty namespace (``oci://n//b/...``, ``oci://@region/...``) is looked up at first use
    and an empty region (``oci://ns@/...``) leaves the region to the ``region`` parameter or the
    credentials.

    Refused, although OME's parser accepts them: an empty object prefix (``oci://bkt``,
    ``oci://n/ns/b/bkt/o/``) — OME turns it into ``/``, which lists no object, so the download fails
    later with "no objects found"; an empty bucket. Read differently: the namespace@region shape is
    recognised only when ``@`` is in the first segment (OME splits at the first ``@`` anywhere, so
    ``oci://bucket/dir@x/more`` became namespace ``bucket/dir``, which cannot be downloaded); here it is
    bucket ``bucket`` and prefix ``dir@x/more/``.
    """
    if uri.startswith("ocios://"):
        rest = _remainder(uri, StorageType.OCI, "ocios://")
    else:
        rest = _remainder(uri, StorageType.OCI)
        if _REGISTRY_REFERENCE.fullmatch(rest):
            raise UnsupportedStorageUri(
                f"OCI URI {_shown(uri)} names an image in a container registry (a ModelPack artifact), which this "
                "agent does not fetch; for OCI Object Storage write ocios://n/{namespace}/b/{bucket}/o/{folder}"
            )
    namespace = region = ""
    if rest.startswith("n/"):
        segments = rest.split("/")
        if len(segments) < 5 or segments[2] != "b" or segments[4] != "o":
            raise InvalidStorageUri(
                f"OCI URI {_shown(uri)} is malformed: expected oci://n/{{namespace}}/b/{{bucket}}/o/{{prefix}}"
            )
        namespace, bucket, prefix = segments[1], segments[3], "/".join(segments[5:])
    else:
        first, _, after = rest.partition("/")
        if "@" in first:
            namespace, _, region = first.partition("@")
            bucket, _, prefix = after.partition("/")
        else:
            bucket, prefix = first, after
    if not bucket:
        raise InvalidStorageUri(
            f"OCI URI {_shown(uri)} has no bucket name: write oci://n/{{namespace}}/b/{{bucket}}/o/{{folder}}"
        )
    if not prefix.strip("/"):
        raise InvalidStorageUri(
            f"OCI URI {_shown(uri)} has no object prefix (OME would list objects under '/' and find none): "
            f"name the folder that holds the model, oci://n/{{namespace}}/b/{bucket}/o/{{folder}}"
        )
    if not prefix.endswith("/"):
        prefix += "/"
    return OciUri(namespace=namespace, bucket=bucket, prefix=prefix, region=region)


def parse_s3_uri(uri: str) -> S3Uri:
    """Parse ``s3://{bucket}[@{region}]/{prefix}`` (prefix kept as written, possibly empty).

    Stricter than OME: ``@`` marks a region only in the bucket segment, and the region may not be empty.
    """
    rest = _remainder(uri, StorageType.S3)
    first, _, prefix = rest.partition("/")
    bucket, at, region = first.partition("@")
    if not bucket:
        raise InvalidStorageUri(f"S3 URI {_shown(uri)} has no bucket name")
    if at and not region:
        raise InvalidStorageUri(f"S3 URI {_shown(uri)} has an empty region after '@'")
    return S3Uri(bucket=bucket, region=region, prefix=prefix)


def parse_gcs_uri(uri: str) -> GcsUri:
    """Parse ``gs://{bucket}/{object}`` (object possibly empty)."""
    rest = _remainder(uri, StorageType.GCS)
    bucket, _, obj = rest.partition("/")
    if not bucket:
        raise InvalidStorageUri(f"GCS URI {_shown(uri)} has no bucket name")
    return GcsUri(bucket=bucket, object=obj)


def parse_azure_uri(uri: str) -> AzureUri:
    """Parse ``az://{account}.blob.core.windows.net/{container}/{blob}`` or ``az://{account}/{container}/{blob}``.

    The blob path may be empty; account and container may not.
    """
    rest = _remainder(uri, StorageType.AZURE)
    if _AZURE_BLOB_HOST in rest:
        account, _, after = rest.partition(_AZURE_BLOB_HOST)
    else:
        account, _, after = rest.partition("/")
    container, _, blob_path = after.partition("/")
    if not account or not container:
        raise InvalidStorageUri(
            f"Azure URI {_shown(uri)} needs an account and a container: az://{{account}}/{{container}}/{{path}}"
        )
    return AzureUri(account=account, container=container, blob_path=blob_path)


def parse_pvc_uri(uri: str) -> PvcUri:
    """Parse ``pvc://[{namespace}:]{pvc_name}/{sub_path}``; the sub-path is mandatory.

    Like OME: the namespace must be a DNS-1123 label (lowercase alphanumerics and ``-``, at most 63,
    no leading or trailing ``-``) and only one ``:`` is allowed. Stricter than OME: a ``..`` segment in
    the sub-path is refused (Kubernetes refuses such a ``subPath``, so the model could never be served).
    """
    rest = _remainder(uri, StorageType.PVC)
    first, slash, sub_path = rest.partition("/")
    if not slash or not sub_path:
        raise InvalidStorageUri(f"PVC URI {_shown(uri)} has no sub-path: expected pvc://{{name}}/{{path}}")
    namespace, colon, pvc_name = first.partition(":")
    if not colon:
        namespace, pvc_name = "", first
    else:
        if ":" in pvc_name:
            raise InvalidStorageUri(f"PVC URI {_shown(uri)} has more than one ':'")
        if not _K8S_NAMESPACE.fullmatch(namespace):
            raise InvalidStorageUri(
                f"PVC URI {_shown(uri)} has an invalid namespace {namespace!r} (lowercase letters, digits "
                "and '-', at most 63 characters)"
            )
    if not pvc_name:
        raise InvalidStorageUri(f"PVC URI {_shown(uri)} has no PVC name")
    if ".." in sub_path.split("/"):
        raise InvalidStorageUri(
            f"PVC URI {_shown(uri)} has a '..' segment in its sub-path, which Kubernetes refuses as a volume "
            "subPath: name the directory inside the volume directly, pvc://[{namespace}:]{claim}/{dir}"
        )
    return PvcUri(namespace=namespace, pvc_name=pvc_name, sub_path=sub_path)


def parse_local_uri(uri: str) -> LocalUri:
    """Parse ``local://{path}``; the path is kept verbatim and may not be empty.

    Whether the path is acceptable (absolute, inside the allowed roots after symlinks) is the local
    layer's decision, not this parser's.
    """
    path = _remainder(uri, StorageType.LOCAL)
    if not path:
        raise InvalidStorageUri(f"local URI {_shown(uri)} has no path")
    return LocalUri(path)


def parse_vendor_uri(uri: str) -> VendorUri:
    """Parse ``vendor://{vendor}/{resource_type}/{resource_path}``; all three parts non-empty."""
    parts = _remainder(uri, StorageType.VENDOR).split("/", 2)
    if len(parts) < 3 or not all(parts):
        raise InvalidStorageUri(
            f"vendor URI {_shown(uri)} is malformed: expected vendor://{{vendor}}/{{resource-type}}/{{path}}"
        )
    return VendorUri(vendor=parts[0], resource_type=parts[1], resource_path=parts[2])


def parse_github_uri(uri: str) -> GithubUri:
    """Parse ``github://{owner}/{repo}[@{tag}]`` exactly as OME splits it.

    The tag is everything after the first ``@`` (``""`` for a bare ``@``), the owner everything before
    the first ``/``, the repository the rest (it may contain ``/``). Nothing is ever fetched for a GitHub
    URI (the model fails with ``UnsupportedStorage``), so the lenient parse costs nothing and keeps the
    reason the same as OME's.
    """
    rest = _remainder(uri, StorageType.GITHUB)
    owner_repo, at, tag = rest.partition("@")
    owner, _, repo = owner_repo.partition("/")
    if not owner or not repo:
        raise InvalidStorageUri(
            f"GitHub URI {_shown(uri)} is malformed: write github://{{owner}}/{{repository}}[@{{tag}}]"
        )
    return GithubUri(owner=owner, repo=repo, tag=tag if at else _GITHUB_DEFAULT_TAG)


_PARSERS: Final[Mapping[StorageType, Callable[[str], StorageUri]]] = {
    StorageType.OCI: parse_oci_uri,
    StorageType.PVC: parse_pvc_uri,
    StorageType.VENDOR: parse_vendor_uri,
    StorageType.HUGGINGFACE: parse_hf_uri,
    StorageType.S3: parse_s3_uri,
    StorageType.AZURE: parse_azure_uri,
    StorageType.GCS: parse_gcs_uri,
    StorageType.GITHUB: parse_github_uri,
    StorageType.LOCAL: parse_local_uri,
}


def _remainder(uri: str, kind: StorageType, prefix: str = "") -> str:
    """Check the prefix (``prefix``, else the type's first) and forbidden characters; return what follows it."""
    prefix = prefix or _PREFIX_OF[kind]
    if not uri.startswith(prefix):
        raise InvalidStorageUri(f"URI {_shown(uri)} does not start with {prefix}")
    if _FORBIDDEN_CHARS.search(uri):
        raise InvalidStorageUri(f"URI {_shown(uri)} contains control characters")
    return uri[len(prefix) :]


def _shown(uri: str) -> str:
    """The URI as it should appear in a message: quoted, escaped, and bounded in length."""
    text = repr(uri)
    return text if len(text) <= 300 else text[:297] + "..."
