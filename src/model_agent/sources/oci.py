"""``oci://`` — OCI Object Storage, through the ``oci`` SDK for the control plane and the ranged engine for bytes.

Role: turn every object under a prefix into a verified file in staging, fetching only what the previous
manifest does not already hold (docs/ome-compatibility.md#10-oci-object-storage-download, without its weaknesses). The
SDK does the control plane in worker
threads: ``GetNamespace`` (URI shape 3 only), ``ListObjects`` page by page (``fields=name,size,md5,etag``,
``nextStartWith``) and ``HeadObject`` per object. The bytes move through
:class:`~model_agent.transfer.RangedDownloader` on the object's URL, every request signed by the SDK's
signer (parallel ranges, resumable part map, bounded memory, ``If-Match`` on the ETag). Signatures are made
in a worker thread, because a security-token signer (instance / resource principal, workload identity) may
first refresh its token over the network, and reused for at most a minute per URL (OCI signs the date,
target and host, not the range). Everything is cancellable: at the next listing page, HEAD or part (OME's
bulk download could not be cancelled, docs/ome-compatibility.md#15-weaknesses-of-omes-go-agent, item 14).

URI shapes (docs/ome-compatibility.md#22-grammars, :func:`model_agent.model.uris.parse_oci_uri`): ``oci://n/{namespace}/b/{bucket}/o/{prefix}``,
``oci://{namespace}@{region}/{bucket}/{prefix}`` and ``oci://{bucket}/{prefix}`` (namespace looked up with
``GetNamespace`` of the credentials' tenancy). Layout as S3 (docs/ome-compatibility.md#24-on-disk-layout): object
``P/a/b`` becomes ``dest/a/b``;
zero-byte names ending in ``/`` (folder markers) are skipped; path safety, reuse, adoption, staging clean-up
and disk reservation are :mod:`model_agent.sources.objects`. No objects is ``NoObjects``.

TensorRT-LLM shape filter (docs/ome-compatibility.md#33-tensorrt-llm-shape-filter): when the caller sets
``FetchRequest.shape_alias`` (a ``tensorrtllm``
model whose ``additionalMetadata.type`` is ``Serving`` or absent), only objects whose full name contains
``/{alias}/`` are fetched (:func:`model_agent.sources.objects.fetch_listed`, so ``s3Compat`` mode too); none
left is ``NoObjects`` ("no suitable objects found for shape ...").

Parameters (``spec.storage.parameters``):

* ``auth`` — ``InstancePrincipal`` (default), ``UserPrincipal``, ``ResourcePrincipal`` or
  ``OkeWorkloadIdentity`` (exact strings, as OME); anything else is ``InvalidParameter``. ``UserPrincipal``
  reads the SDK config file at ``OCI_CONFIG_PATH`` (default ``~/.oci/config``), profile ``PROFILE`` (default
  ``DEFAULT``), and with ``USE_SESSION_TOKEN=true`` signs with the profile's ``security_token_file``
  (session token) instead of its API key. The others use the SDK's standard environment and files (instance
  metadata; ``OCI_RESOURCE_PRINCIPAL_*``; the pod's service-account token). Signers are built lazily, on the
  first fetch that needs them, in a worker thread, and kept (clients are cached per configuration).
* ``region`` — the region; else the ``@region`` of the URI (OME ignores it; we do not), else the
  credentials' own region (config file profile, instance metadata, resource principal).
* ``endpoint`` — the Object Storage API base URL (``http://127.0.0.1:8080`` for a local server, a private
  endpoint, ...); else the environment variable ``MODEL_AGENT_OCI_ENDPOINT``; else the SDK's regional URL.
* ``s3Compat`` — ``"true"``: fetch through OCI's S3-compatible API with the ``s3://`` source instead, at
  ``https://{namespace}.compat.objectstorage.{region}.oraclecloud.com`` (or ``endpoint`` when given),
  path-style, with the Customer Secret Key pair from the Secret named by ``spec.storage.key``
  (``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` or ``accessKeyId`` + ``secretAccessKey``). It needs a
  region and a namespace (URI shapes 1 and 2; for shape 3 the namespace is looked up with ``auth`` as above).

Tenant models (a BaseModel outside the trusted namespaces, :mod:`model_agent.sources.egress`): a native fetch
signs only with the node's identity, which never serves a tenant, so it is refused (``CredentialRefused``)
before any SDK call; ``s3Compat`` with the tenant's own Customer Secret Key and a URI that names the namespace
is allowed, under the ``s3://`` source's tenant rules (allow-listed endpoint, checked addresses, unsigned
without a Secret). So the OCI SDK, which follows redirects and echoes response bodies into its errors, never
talks on a tenant's behalf.

``spec.storage.key`` is not used by native OCI fetches (docs/ome-compatibility.md#101-client: OCI credentials come from
the node,
never a Secret); the agent reads the Secret only in ``s3Compat`` mode (:func:`uses_storage_secret`), so a
stale ``key`` on an OCI model does not fail it as OME would not.

Verification, per object, from ``HeadObject``: the size always; the MD5 when the object has one — OCI's
``Content-MD5`` (base64) of a single-part upload, or for a multipart upload (``opc-multipart-md5``, which is
an MD5 of the part MD5s, not of the object) the ``opc-meta-md5`` user metadata when present, as OME reads it;
sha256 always (the engine computes it, for the manifest and later ``verify`` passes). A mismatch is
``VerificationFailed`` (its message names ``md5``).

SDK errors become :class:`~model_agent.sources.base.SourceError` reasons: ``BucketNotFound`` (OCI answers 404
also when the caller may not see the bucket), ``ObjectNotFound``, ``NamespaceNotFound``, ``Unauthorized``
(401), ``AccessDenied`` (403), ``RateLimited`` (429), ``SourceUnreachable`` (connection), ``NoCredentials``
(config file, profile or key missing or unreadable), ``SourceError`` otherwise. The SDK's own retries are
bounded (3 attempts within 60 s) and its process-wide circuit breaker is off: the agent's retry and breaker
policies apply above the source.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Unpack
from urllib.parse import quote

from model_agent.model.reasons import Reason
from model_agent.model.uris import InvalidStorageUri, parse_oci_uri
from model_agent.sources.base import FetchRequest, FetchResult, Progress, SourceError, SourceRules
from model_agent.sources.egress import guard_for, refused
from model_agent.sources.listing import ListingBudget
from model_agent.sources.objects import (
    ObjectGet,
    ObjectStoreFetch,
    RemoteObject,
    StoreTuning,
    listed_object,
    parsed_uri,
    status_error,
)
from model_agent.sources.s3 import S3Source
from model_agent.transfer import Expected, b64_to_hex

PARAM_AUTH = "auth"
PARAM_REGION = "region"
PARAM_ENDPOINT = "endpoint"
PARAM_S3_COMPAT = "s3Compat"
ENDPOINT_ENV = "MODEL_AGENT_OCI_ENDPOINT"
CONFIG_PATH_ENV = "OCI_CONFIG_PATH"
PROFILE_ENV = "PROFILE"
SESSION_TOKEN_ENV = "USE_SESSION_TOKEN"
AUTH_TYPES = ("InstancePrincipal", "UserPrincipal", "ResourcePrincipal", "OkeWorkloadIdentity")
DEFAULT_AUTH = "InstancePrincipal"
LIST_FIELDS = "name,size,md5,etag"
SIGNATURE_REUSE_S = 60.0  # OCI accepts a signed date within 5 minutes of its clock
_CLIENT_CACHE_SIZE = 16
_TRUE = ("true", "1", "yes")


@dataclass(frozen=True)
class OciSettings:
    namespace: str  # "" until looked up (URI shape 3)
    bucket: str
    prefix: str  # ends with "/"
    region: str | None
    endpoint: str | None
    auth: str
    s3_compat: bool

    def label(self, name: str = "") -> str:
        return f"oci://n/{self.namespace or '?'}/b/{self.bucket}/o/{name or self.prefix}"


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in _TRUE


def uses_storage_secret(parameters: Mapping[str, str]) -> bool:
    """Whether an ``oci://`` model reads the Secret of ``spec.storage.key`` (only in ``s3Compat`` mode)."""
    return _flag(parameters.get(PARAM_S3_COMPAT))


def needs_node_identity(namespace: str | None, s3_compat: bool) -> bool:
    """Whether a fetch can only sign with the node's OCI identity (never a tenant's): every native fetch; an
    S3-compatible one that names its namespace signs with the Customer Secret Key of ``spec.storage.key``."""
    return not (s3_compat and namespace)


def tenant_refused(uri: str, parameters: Mapping[str, str]) -> bool:
    """:func:`needs_node_identity` for a spec (the pre-flight check's view); False for a URI that does not parse."""
    try:
        parsed = parse_oci_uri(uri)
    except InvalidStorageUri:
        return False
    return needs_node_identity(parsed.namespace, _flag(parameters.get(PARAM_S3_COMPAT)))


def settings_for(request: FetchRequest) -> OciSettings:
    """Namespace, bucket, prefix, region, endpoint and auth type of one fetch, or a SourceError."""
    uri = parsed_uri(parse_oci_uri, request)
    params = request.parameters
    auth = (params.get(PARAM_AUTH) or "").strip() or DEFAULT_AUTH
    if auth not in AUTH_TYPES:
        raise SourceError(
            Reason.INVALID_PARAMETER,
            f"parameters.{PARAM_AUTH} must be one of {', '.join(AUTH_TYPES)}, not {auth[:100]!r}",
            retryable=False,
        )
    endpoint = (params.get(PARAM_ENDPOINT) or "").strip() or os.environ.get(ENDPOINT_ENV, "").strip() or None
    if endpoint is not None:
        if not endpoint.startswith(("http://", "https://")) or len(endpoint.split("://", 1)[1].strip("/")) == 0:
            raise SourceError(
                Reason.INVALID_PARAMETER,
                f"the OCI endpoint must be an http(s) URL, not {endpoint[:200]!r}",
                retryable=False,
            )
        endpoint = endpoint.rstrip("/")
    return OciSettings(
        namespace=uri.namespace,
        bucket=uri.bucket,
        prefix=uri.prefix,
        region=(params.get(PARAM_REGION) or "").strip() or uri.region or None,
        endpoint=endpoint,
        auth=auth,
        s3_compat=_flag(params.get(PARAM_S3_COMPAT)),
    )


def s3_compat_request(request: FetchRequest, settings: OciSettings) -> FetchRequest:
    """The same fetch, addressed to OCI's S3-compatible API (for :class:`S3Source`); namespace must be known."""
    if not settings.region and not settings.endpoint:
        raise SourceError(
            Reason.INVALID_PARAMETER,
            f"parameters.{PARAM_S3_COMPAT} needs parameters.{PARAM_REGION} (or an oci://ns@region/... URI)",
            retryable=False,
        )
    endpoint = (
        settings.endpoint or f"https://{settings.namespace}.compat.objectstorage.{settings.region}.oraclecloud.com"
    )
    parameters = {"endpoint": endpoint, "addressingStyle": "path"}
    if settings.region:
        parameters["region"] = settings.region
    return replace(request, storage_uri=f"s3://{settings.bucket}/{settings.prefix}", parameters=parameters)


def md5_of_listing(value: str | None) -> str | None:
    """The hex MD5 of a listing's base64 ``md5`` field; None for a multipart value (``<b64>-<parts>``)."""
    if not value or "-" in value:
        return None
    hexed = b64_to_hex(value)
    return hexed if hexed is not None and len(hexed) == 32 else None


def _md5_value(value: str | None) -> str | None:
    """An MD5 given as base64 (as OCI and OME write it) or as 32 hex digits; None otherwise."""
    if not value:
        return None
    value = value.strip()
    if len(value) == 32 and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    return md5_of_listing(value)


def expected_from_head(headers: Mapping[str, str]) -> Expected:
    """What a ``HeadObject`` lets us check about the object; see the module doc."""
    lower = {k.lower(): v for k, v in headers.items()}
    size = int(lower["content-length"])
    checksums: dict[str, str] = {}
    if "opc-multipart-md5" in lower:
        md5 = _md5_value(lower.get("opc-meta-md5"))
    else:
        md5 = _md5_value(lower.get("content-md5"))
    if md5 is not None:
        checksums["md5"] = md5
    return Expected(size=size, checksums=checksums, validator=lower.get("etag") or None)


def _classify(exc: BaseException, label: str) -> SourceError:
    from oci import exceptions as ox

    if isinstance(exc, SourceError):
        return exc
    if isinstance(exc, ox.ServiceError):
        code = str(exc.code or "")
        status = int(exc.status or 0)
        request_id = f" (opc-request-id {exc.request_id})" if exc.request_id else ""
        message = str(exc.message or "")[:200]
        if code == "BucketNotFound":
            return SourceError(
                Reason.BUCKET_NOT_FOUND, f"{label}: the bucket does not exist or is not visible to us{request_id}"
            )
        if code == "NamespaceNotFound":
            return SourceError(Reason.NAMESPACE_NOT_FOUND, f"{label}: the namespace does not exist{request_id}")
        known = status_error(status, label, code or f"HTTP {status}", suffix=request_id)
        if known is not None:
            return known
        return SourceError(Reason.SOURCE_ERROR, f"{label}: HTTP {status} {code}: {message}{request_id}"[:400])
    if isinstance(exc, ox.ConfigFileNotFound | ox.ProfileNotFound | ox.InvalidConfig | ox.InvalidKeyFilePath):
        return SourceError(Reason.NO_CREDENTIALS, f"{label}: OCI configuration unusable: {str(exc)[:300]}")
    if isinstance(exc, ox.InvalidPrivateKey):
        return SourceError(Reason.NO_CREDENTIALS, f"{label}: the OCI API signing key cannot be loaded")
    if isinstance(exc, ox.RequestException | ox.ConnectTimeout | ConnectionError | TimeoutError):
        return SourceError(Reason.SOURCE_UNREACHABLE, f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
    if isinstance(exc, OSError):
        return SourceError(Reason.NO_CREDENTIALS, f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
    return SourceError(Reason.SOURCE_ERROR, f"{label}: {type(exc).__name__}: {str(exc)[:300]}")


# ---------------------------------------------------------------------- signers (blocking; run in threads)


def _user_principal() -> tuple[Any, dict[str, Any]]:
    import oci

    path = os.environ.get(CONFIG_PATH_ENV, "").strip() or oci.config.DEFAULT_LOCATION
    profile = os.environ.get(PROFILE_ENV, "").strip() or oci.config.DEFAULT_PROFILE
    config = oci.config.from_file(path, profile)
    if _flag(os.environ.get(SESSION_TOKEN_ENV)):
        token_file = config.get("security_token_file")
        if not token_file:
            raise oci.exceptions.InvalidConfig({"security_token_file": "missing (USE_SESSION_TOKEN is set)"})
        token = Path(os.path.expanduser(token_file)).read_text().strip()
        key = oci.signer.load_private_key_from_file(config["key_file"], config.get("pass_phrase"))
        return oci.auth.signers.SecurityTokenSigner(token, key), config
    return oci.signer.Signer.from_config(config), config


def _instance_principal() -> tuple[Any, dict[str, Any]]:
    import oci

    return oci.auth.signers.InstancePrincipalsSecurityTokenSigner(), {}


def _resource_principal() -> tuple[Any, dict[str, Any]]:
    import oci

    return oci.auth.signers.get_resource_principals_signer(), {}


def _oke_workload_identity() -> tuple[Any, dict[str, Any]]:
    import oci

    return oci.auth.signers.get_oke_workload_identity_resource_principal_signer(), {}


SIGNER_FACTORIES: dict[str, Callable[[], tuple[Any, dict[str, Any]]]] = {
    "UserPrincipal": _user_principal,
    "InstancePrincipal": _instance_principal,
    "ResourcePrincipal": _resource_principal,
    "OkeWorkloadIdentity": _oke_workload_identity,
}


@dataclass
class OciClient:
    """An SDK client with the signer it uses and the base URL of its Object Storage API."""

    sdk: Any  # oci.object_storage.ObjectStorageClient
    signer: Any
    endpoint: str

    def object_url(self, namespace: str, bucket: str, name: str) -> str:
        return f"{self.endpoint}/n/{quote(namespace, safe='')}/b/{quote(bucket, safe='')}/o/{quote(name, safe='/')}"


class _SignedGets:
    """Signature headers per object URL, made in a worker thread and reused for up to ``reuse_s`` seconds."""

    def __init__(self, signer: Any, reuse_s: float = SIGNATURE_REUSE_S) -> None:
        self.signer = signer
        self.reuse_s = reuse_s
        self._cache: dict[str, tuple[dict[str, str], float]] = {}
        self._lock = threading.Lock()

    def sign(self, url: str) -> dict[str, str]:
        from oci._vendor import requests

        prepared = requests.Request("GET", url).prepare()
        self.signer(prepared)
        headers = {"date": prepared.headers["date"], "authorization": prepared.headers["authorization"]}
        with self._lock:
            self._cache[url] = (headers, time.monotonic())
        return headers

    def _fresh(self, url: str) -> dict[str, str] | None:
        with self._lock:
            cached = self._cache.get(url)
        if cached is not None and time.monotonic() - cached[1] < self.reuse_s:
            return cached[0]
        return None

    def url_source(self, url: str) -> Callable[[], Awaitable[str]]:
        async def current() -> str:
            if self._fresh(url) is None:
                await asyncio.to_thread(self.sign, url)
            return url

        return current

    def headers(self, url: str) -> Mapping[str, str]:
        return self._fresh(url) or self.sign(url)  # signed moments ago by url_source; inline only as a fallback


def md5_mismatch(error: SourceError) -> bool:
    """Whether a failed verification of an OCI fetch was an MD5 mismatch (the engine's message names it)."""
    return error.reason == Reason.VERIFICATION_FAILED and "md5" in error.message.lower()


class OciSource(ObjectStoreFetch):
    """The ``oci://`` source; one instance serves every OCI model of the agent (clients are cached)."""

    # Node credentials, never a Secret (docs/ome-compatibility.md#101-client), except in S3-compatible mode;
    # OME's OCI-only metrics; the TensorRT-LLM shape filter.
    rules = SourceRules(
        reads_secret=uses_storage_secret, counts_listed_bytes=True, md5_failure=md5_mismatch, shape_filter=True
    )

    def __init__(
        self,
        *,
        page_size: int = 1000,
        s3: S3Source | None = None,
        signer_factories: Mapping[str, Callable[[], tuple[Any, dict[str, Any]]]] | None = None,
        **tuning: Unpack[StoreTuning],
    ) -> None:
        super().__init__(**tuning)
        self.page_size = page_size
        self.s3 = s3 or S3Source(ranged=self.ranged, capacity=self.capacity, max_parallel_files=self.max_parallel_files)
        self.signer_factories = dict(signer_factories or SIGNER_FACTORIES)
        self._clients: dict[tuple[Any, ...], OciClient] = {}
        self._namespaces: dict[tuple[Any, ...], str] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ SDK (blocking; run in threads)

    def _cache_key(self, settings: OciSettings) -> tuple[Any, ...]:
        env = tuple(os.environ.get(k, "") for k in (CONFIG_PATH_ENV, PROFILE_ENV, SESSION_TOKEN_ENV))
        return (settings.auth, settings.region, settings.endpoint, env)

    def client(self, settings: OciSettings) -> OciClient:
        key = self._cache_key(settings)
        with self._lock:
            cached = self._clients.get(key)
        if cached is not None:
            return cached
        import oci

        signer, config = self.signer_factories[settings.auth]()
        region = settings.region or config.get("region") or getattr(signer, "region", None)
        client_config: dict[str, Any] = {**config, "region": region} if region else dict(config)
        if not settings.endpoint and not region:
            raise SourceError(
                Reason.INVALID_PARAMETER,
                f"{settings.label()}: no region: set parameters.{PARAM_REGION} or use oci://ns@region/...",
                retryable=False,
            )
        retry = oci.retry.RetryStrategyBuilder(
            max_attempts_check=True,
            max_attempts=3,
            total_elapsed_time_check=True,
            total_elapsed_time_seconds=60,
        ).get_retry_strategy()
        sdk = oci.object_storage.ObjectStorageClient(
            client_config,
            signer=signer,
            service_endpoint=settings.endpoint,
            retry_strategy=retry,
            circuit_breaker_strategy=oci.circuit_breaker.NoCircuitBreakerStrategy(),
            timeout=(20, 60),
        )
        client = OciClient(sdk, signer, str(sdk.base_client.endpoint).rstrip("/"))
        with self._lock:
            if len(self._clients) >= _CLIENT_CACHE_SIZE:
                self._clients.pop(next(iter(self._clients)))
            self._clients[key] = client
        return client

    def namespace(self, client: OciClient, settings: OciSettings) -> str:
        key = self._cache_key(settings)
        with self._lock:
            known = self._namespaces.get(key)
        if known is not None:
            return known
        found = str(client.sdk.get_namespace().data)
        with self._lock:
            self._namespaces[key] = found
        return found

    def list_page(
        self, client: OciClient, settings: OciSettings, start: str | None, budget: ListingBudget | None = None
    ) -> tuple[list[RemoteObject], str | None]:
        kwargs: dict[str, Any] = {"prefix": settings.prefix, "limit": self.page_size, "fields": LIST_FIELDS}
        if start is not None:
            kwargs["start"] = start
        data = client.sdk.list_objects(settings.namespace, settings.bucket, **kwargs).data
        objects: list[RemoteObject] = []
        if budget is not None:
            budget.page()
        for item in data.objects or []:
            if budget is not None:
                budget.item(str(item.name))
            obj = listed_object(
                str(item.name), int(item.size or 0), str(item.etag or ""), settings.prefix, md5_of_listing(item.md5)
            )
            if obj is not None:
                objects.append(obj)
        return objects, data.next_start_with or None

    # ------------------------------------------------------------------ fetch

    async def fetch(self, request: FetchRequest) -> FetchResult:
        settings = settings_for(request)
        guard = guard_for(request.owner)
        if guard is not None and needs_node_identity(settings.namespace, settings.s3_compat):
            raise refused(
                Reason.CREDENTIAL_REFUSED,
                f"a {guard.owner.describe()} may not use the node's OCI identity, and a native oci:// fetch signs "
                f"with nothing else: use parameters.{PARAM_S3_COMPAT}=true with a Customer Secret Key in "
                "spec.storage.key and a URI that names the namespace",
            )
        progress = Progress(phase="scanning")
        request.on_progress(progress)
        client: OciClient | None = None
        try:
            if not settings.s3_compat or not settings.namespace:
                client = await asyncio.to_thread(self.client, settings)
            if not settings.namespace:
                assert client is not None
                settings = replace(settings, namespace=await asyncio.to_thread(self.namespace, client, settings))
        except Exception as exc:
            raise _classify(exc, settings.label()) from exc
        if settings.s3_compat:
            return await self.s3.fetch(s3_compat_request(request, settings))
        assert client is not None
        objects: list[RemoteObject] = []
        start: str | None = None
        budget = ListingBudget(settings.label())
        try:
            while True:  # page by page: a cancellation takes effect between pages
                page, start = await asyncio.to_thread(self.list_page, client, settings, start, budget)
                objects.extend(page)
                if start is None:
                    break
        except Exception as exc:
            raise _classify(exc, settings.label()) from exc
        if not objects:
            raise SourceError(Reason.NO_OBJECTS, f"no objects found under {settings.label()}")

        signed = _SignedGets(client.signer)

        async def prepare(obj: RemoteObject) -> ObjectGet:
            try:
                head = await asyncio.to_thread(client.sdk.head_object, settings.namespace, settings.bucket, obj.key)
            except Exception as exc:
                raise _classify(exc, settings.label(obj.key)) from exc
            url = client.object_url(settings.namespace, settings.bucket, obj.key)
            return ObjectGet(expected_from_head(dict(head.headers)), signed.url_source(url), signed.headers)

        return await self.fetch_objects(request, objects, label=settings.label, progress=progress, prepare=prepare)
