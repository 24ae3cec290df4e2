"""``gs://bucket/prefix`` (Google Cloud Storage) and ``az://account/container/prefix`` (Azure Blob Storage).

Role: the GCS and Azure sources. obstore (the Rust ``object_store`` crate) does the control plane: listing,
credentials (Secret or ambient chain) and URL signing. The listing becomes
:class:`~model_agent.sources.objects.RemoteObject` values and goes to
:func:`~model_agent.sources.objects.fetch_listed` (layout, path safety, reuse, staging cleanup, disk
reservation), which hands each object's :class:`~model_agent.sources.objects.ObjectGet` (from the probe below)
to the ranged engine (:mod:`model_agent.transfer`: parallel ranges, resumable part map, ``If-Match`` on the
ETag, bounded memory) on signed GET URLs, renewed every ten minutes
(:class:`~model_agent.sources.objects.SignedUrls`). Same guarantees and layout as
``s3://``: the prefix is taken as a folder, ``P/a/b`` becomes ``dest/a/b``, unsafe keys are
``UnsafeFilePath``, no objects is ``NoObjects``.

Why signed URLs into the ranged engine rather than obstore's ``get_range``: the engine already has the part
map, resume, verification beside the transfer and bounded memory, and obstore signs for both stores with
every credential kind it holds, including ambient ones (measured against fake-gcs-server 1.56.1 and
Azurite 3.37.0 on loopback, 2026-11: listing, signing, ranged GET with ``If-Match`` all work). With ambient
credentials signing costs one permission: GCS signs through the IAM ``signBlob`` API (the workload's
service account needs ``iam.serviceAccounts.signBlob`` on itself, e.g. *Service Account Token Creator*),
Azure through a user delegation key (the identity needs ``generateUserDelegationKey``, e.g. *Storage Blob
Delegator*, beside read and list). A Secret with a service account key, an account key or a SAS token
needs nothing more.

What it costs (``bench/cloud.py``, 128 MiB to tmpfs, same emulators, a shared 2-core machine at load 11-16,
2026-11): the engine took 0.9-1.6 s (0.5-0.9 CPU-s) where ``obstore.get_async`` streamed into a file took
0.6-1.1 s (0.33-0.4 CPU-s); fixed overhead (list, probe, sign) 0.07-0.16 s. Re-measured on the shared
objects module at load 4-6: engine 0.73-1.24 s (0.46-0.8 CPU-s), stream 0.37-0.67 s (0.29-0.33 CPU-s), peak
RSS 262 MiB with the 128 MiB upload buffer (``bench/results/cloud.json``). The emulators serve parallel
ranges no faster than one stream and the engine also computes the MD5, so on loopback the plain stream
wins; the engine is kept for what the stream lacks (resume from a part map, verification, bounded memory,
parallel connections where one connection is capped, as on the real stores). Throughput belongs to
``bench/ranged.py`` against nginx.

Verification, per object, from a one-byte ranged GET on the signed URL (verb-independent, unlike a HEAD,
which a GCS V4 signature for GET does not allow): the size (``Content-Range``) always; the MD5 the store
publishes when it has one (GCS ``x-goog-hash: md5=`` — absent for composite objects; Azure
``x-ms-blob-content-md5`` — present when the uploader set it, which Put Blob does and block-list uploads
usually do not); the ETag as validator. obstore's ``head``/``list`` expose only path, size, ETag, mtime and
version, not these hashes, hence the probe. GCS's CRC32C is verified when it is all the object has (composite
objects carry no MD5): with an MD5 it would add 0.18 CPU-s/GB for no stronger guarantee. sha256 is always computed. The
probes of one fetch share an HTTP session of their own: the shared download path opens the engine's session
only once it knows what to fetch, and asks the source per object (a probe) from inside it.

URI forms: ``gs://{bucket}/{prefix}``; ``az://{account}/{container}/{prefix}`` or
``az://{account}.blob.core.windows.net/{container}/{prefix}``.

Parameters (``spec.storage.parameters``):

* ``endpoint`` — the store's base URL. GCS: default ``https://storage.googleapis.com``; fake-gcs-server
  ``http://host:4443``. Azure: default ``https://{account}.blob.core.windows.net``; Azurite, path style
  with the account: ``http://host:10000/devstoreaccount1``.
* ``anonymous`` — ``"true"``: unsigned requests (public buckets/containers); no credentials are looked up.

Credentials: the Secret named by ``spec.storage.key`` (read by the caller into ``FetchRequest.secret``):

* GCS: a service account key file (JSON with ``client_email`` and ``private_key``) under
  ``serviceAccountKey``, ``GOOGLE_SERVICE_ACCOUNT_KEY`` or ``key.json``.
* Azure, the first present of: ``accountKey`` / ``AZURE_STORAGE_ACCOUNT_KEY`` (shared key);
  ``sasToken`` / ``AZURE_STORAGE_SAS_TOKEN`` (a SAS with read and list permission, with or without the
  leading ``?``); ``clientId`` + ``clientSecret`` + ``tenantId`` / ``AZURE_CLIENT_ID`` +
  ``AZURE_CLIENT_SECRET`` + ``AZURE_TENANT_ID`` (a service principal).

A named Secret with none of these is ``SecretInvalid``. Without a Secret, obstore's ambient chain applies:
GCS application default credentials (``GOOGLE_APPLICATION_CREDENTIALS``, GKE workload identity / instance
metadata); Azure environment variables, workload identity (federated token file), managed identity.

Tenant models (a BaseModel outside the trusted namespaces, :mod:`model_agent.sources.egress`): without a
Secret the requests are unsigned (``skip_signature``: obstore never builds the ambient chain's token). A
tenant's Azure account key or SAS is handed to obstore as an explicit credential provider, because obstore
otherwise ranks credentials from the environment above the configured SAS or service principal (measured:
a SAS configured beside ``AZURE_STORAGE_ACCOUNT_KEY`` in the environment was signed with the environment's
key); a tenant's Azure service principal is refused (``CredentialRefused``) for the same reason. A GCS
service account key from the Secret wins over ``GOOGLE_APPLICATION_CREDENTIALS`` (measured). The endpoint,
given or default, must be on the allow-list, and its host's addresses pass the address rules before the
store is used; the probes resolve through the guard (aiohttp connects to the checked address) and follow no
redirect; the ranged GETs use the engine's checked connections. Reasons carry status and error code only.
Residual risk: obstore (Rust) resolves and connects on its own and follows redirects, so its listing can
reach what a host whose DNS or redirects the tenant controls points to — only hosts on the admin's
allow-list are ever contacted (by default the stores' own public hosts, whose DNS and redirects no tenant
controls), and its answers never reach a reason.

Errors: obstore's are classified into ``SecretInvalid`` (a key obstore cannot parse), ``NoCredentials``
(the ambient chain found no token; with a Secret's service principal: ``Unauthorized``),
``BucketNotFound`` (missing bucket or container), ``ObjectNotFound``, ``Unauthorized`` (credentials rejected),
``AccessDenied``, ``RateLimited``, ``SourceUnreachable``, ``SigningFailed`` (ambient credentials that may
not sign) or ``SourceError``; query strings are cut from messages (a SAS carries its signature there).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Unpack

import aiohttp

from model_agent.model import json_text
from model_agent.model.reasons import Reason
from model_agent.model.uris import parse_azure_uri, parse_gcs_uri
from model_agent.sources.base import FetchRequest, FetchResult, Progress, SourceError
from model_agent.sources.egress import CredentialUse, Guard, credential_for, current, guard_for, refused
from model_agent.sources.listing import ListingBudget
from model_agent.sources.objects import (
    ObjectGet,
    ObjectStoreFetch,
    RemoteObject,
    SignedUrls,
    StoreTuning,
    folder_prefix,
    listed_object,
    parsed_uri,
    status_error,
)
from model_agent.transfer import Expected, b64_to_hex

if TYPE_CHECKING:
    from obstore.store import AzureStore, GCSStore

GCS = "gs"
AZURE = "az"
PARAM_ENDPOINT = "endpoint"
PARAM_ANONYMOUS = "anonymous"
GCS_KEY_NAMES = ("serviceAccountKey", "GOOGLE_SERVICE_ACCOUNT_KEY", "key.json")
AZURE_ACCOUNT_KEY_NAMES = ("accountKey", "AZURE_STORAGE_ACCOUNT_KEY")
AZURE_SAS_NAMES = ("sasToken", "AZURE_STORAGE_SAS_TOKEN")
AZURE_PRINCIPAL_NAMES = (
    ("clientId", "clientSecret", "tenantId"),
    ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID"),
)
DEFAULT_SIGN_EXPIRY_S = 3600
SIGN_RENEW_S = 600.0
PROBE_TIMEOUT_S = 60.0
_STORE_CACHE_SIZE = 16
_HTTP_STATUS = re.compile(r"status code: (\d{3})")
_XML_CODE = re.compile(r"<Code>([A-Za-z0-9]+)</Code>")
_QUERY = re.compile(r"\?\S*")
_MD5_HEX = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class CloudSettings:
    scheme: str  # GCS or AZURE
    account: str  # Azure storage account ("" for GCS)
    bucket: str  # GCS bucket or Azure container
    prefix: str  # "" (everything) or ends with "/"
    endpoint: str  # base URL, without a trailing "/"
    endpoint_given: bool
    anonymous: bool
    # obstore configuration keys holding the credentials (never printed); empty: the ambient chain.
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    guard: Guard | None = None  # a tenant model's rules (sources/egress.py); None: trusted

    @property
    def ambient(self) -> bool:
        """Credentials come from the environment (no Secret, not anonymous)."""
        return not self.credentials and not self.anonymous

    def label(self, key: str = "") -> str:
        where = f"{self.account}/{self.bucket}" if self.scheme == AZURE else self.bucket
        return f"{self.scheme}://{where}/{key or self.prefix}"

    def object_url(self, key: str) -> str:
        return f"{self.endpoint}/{urllib.parse.quote(self.bucket, safe='')}/{urllib.parse.quote(key, safe='/')}"


def _first(data: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((data[n] for n in names if data.get(n)), None)


def gcs_credentials(data: Mapping[str, str] | None) -> dict[str, str]:
    """obstore configuration for the service account key in a Secret (see the module doc); {} for no Secret."""
    if data is None:
        return {}
    raw = _first(data, GCS_KEY_NAMES)
    try:
        doc = json_text.loads(raw) if raw else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not doc.get("client_email") or not doc.get("private_key"):
        raise SourceError(
            Reason.SECRET_INVALID,
            "the Secret named by spec.storage.key has no service account key (JSON with client_email and "
            f"private_key) under {', '.join(GCS_KEY_NAMES)}",
        )
    return {"service_account_key": raw or ""}


def azure_credentials(data: Mapping[str, str] | None) -> dict[str, str]:
    """obstore configuration for the Azure credential in a Secret (see the module doc); {} for no Secret."""
    if data is None:
        return {}
    if key := _first(data, AZURE_ACCOUNT_KEY_NAMES):
        return {"account_key": key}
    if sas := _first(data, AZURE_SAS_NAMES):
        return {"sas_key": sas.lstrip("?")}
    for client_id, secret, tenant in AZURE_PRINCIPAL_NAMES:
        if data.get(client_id) and data.get(secret) and data.get(tenant):
            return {"client_id": data[client_id], "client_secret": data[secret], "tenant_id": data[tenant]}
    raise SourceError(
        Reason.SECRET_INVALID,
        "the Secret named by spec.storage.key has none of accountKey, sasToken or clientId + clientSecret + "
        "tenantId (or their AZURE_* spellings)",
    )


def settings_for(request: FetchRequest) -> CloudSettings:
    """Where and how one ``gs://`` or ``az://`` fetch reads, or a SourceError."""
    if request.storage_uri.startswith("gs://"):
        gcs = parsed_uri(parse_gcs_uri, request)
        scheme, account, bucket, prefix = GCS, "", gcs.bucket, gcs.object
        default_endpoint = "https://storage.googleapis.com"
    else:
        az = parsed_uri(parse_azure_uri, request)
        scheme, account, bucket, prefix = AZURE, az.account, az.container, az.blob_path
        default_endpoint = f"https://{account}.blob.core.windows.net"
    params = request.parameters
    endpoint = (params.get(PARAM_ENDPOINT) or "").strip().rstrip("/")
    if endpoint and not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", endpoint):
        raise SourceError(
            Reason.INVALID_PARAMETER,
            f"parameters.{PARAM_ENDPOINT} must be an http(s) URL, not {endpoint[:200]!r}",
            retryable=False,
        )
    guard = guard_for(request.owner)
    if guard is not None:
        guard.check_allowed(endpoint or default_endpoint, "parameters.endpoint" if endpoint else "the default endpoint")
    asked_anonymous = (params.get(PARAM_ANONYMOUS) or "").strip().lower() in ("true", "1", "yes")
    use = credential_for(request.owner, current(), has_secret=request.secret is not None, anonymous=asked_anonymous)
    anonymous = use == CredentialUse.ANONYMOUS
    credentials: dict[str, str] = {}
    if not anonymous:
        credentials = gcs_credentials(request.secret) if scheme == GCS else azure_credentials(request.secret)
    if guard is not None and "client_secret" in credentials:
        raise refused(
            Reason.CREDENTIAL_REFUSED,
            f"a {guard.owner.describe()} may not use an Azure service principal (obstore would rank the node's "
            "environment credentials above it): use accountKey or sasToken",
        )
    return CloudSettings(
        scheme=scheme,
        account=account,
        bucket=bucket,
        prefix=folder_prefix(prefix),
        endpoint=endpoint or default_endpoint,
        endpoint_given=bool(endpoint),
        anonymous=anonymous,
        credentials=credentials,
        guard=guard,
    )


def md5_from_base64(value: str | None) -> str | None:
    """A base64 MD5 (``Content-MD5``, ``x-goog-hash: md5=``, ``x-ms-blob-content-md5``) in hex, else None."""
    hexed = b64_to_hex(value) if value else None
    return hexed if hexed is not None and len(hexed) == 32 else None


def md5_from_etag(etag: str) -> str | None:
    """The MD5 a GCS ETag carries when it is one: 32 hex digits (XML API) or 16 bytes in base64 (fake-gcs-server).

    Azure ETags are opaque (``0x8D...``): never an MD5.
    """
    raw = etag.strip('"').lower()
    if _MD5_HEX.fullmatch(raw):
        return raw
    return md5_from_base64(etag.strip('"'))


def _all(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of a header (GCS sends ``x-goog-hash`` twice: crc32c and md5), from aiohttp or a dict."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return [str(v) for v in getall(name, [])]
    return [headers[name]] if name in headers else []


def expected_from_probe(status: int, headers: Mapping[str, str], listed: RemoteObject) -> Expected:
    """What a one-byte ranged GET tells about the whole object: size, published MD5, ETag (see the module doc)."""
    size = listed.size
    content_range = headers.get("Content-Range", "")
    if status == 206 and "/" in content_range:
        total = content_range.rsplit("/", 1)[1].strip()
        if total.isdigit():
            size = int(total)
    elif status == 200 and (length := headers.get("Content-Length", "")).isdigit():
        size = int(length)
    checksums: dict[str, str] = {}
    md5: str | None = None
    crc32c: str | None = None
    for part in ",".join(_all(headers, "x-goog-hash")).split(","):
        name, _, value = part.strip().partition("=")
        if name == "md5":
            md5 = md5_from_base64(value)
        elif name == "crc32c":
            crc = b64_to_hex(value)
            crc32c = crc if crc is not None and len(crc) == 8 else None
    if md5 is None:
        md5 = md5_from_base64(
            headers.get("x-ms-blob-content-md5") or (headers.get("Content-MD5") if status == 200 else None)
        )
    if md5 is not None:
        checksums["md5"] = md5
    elif crc32c is not None:
        checksums["crc32c"] = crc32c  # a composite object: its CRC32C is all GCS publishes
    return Expected(size=size, checksums=checksums, validator=headers.get("ETag") or listed.etag)


def _message(exc: BaseException) -> str:
    """obstore's message: its first line, query strings (SAS signatures) cut, bounded."""
    text = str(exc).split("Debug source:", 1)[0].strip().splitlines()
    return _QUERY.sub("?...", text[0] if text else type(exc).__name__)[:400]


def classify(
    exc: BaseException, label: str, *, listing: bool, ambient: bool = False, tenant: bool = False
) -> SourceError:
    """An obstore error as a SourceError reason (see the module doc); for a tenant, no text the store sent."""
    if isinstance(exc, SourceError):
        return exc
    text = str(exc)
    status_match = _HTTP_STATUS.search(text)
    status = int(status_match[1]) if status_match else 0
    code_match = _XML_CODE.search(text)
    code = code_match[1][:64] if code_match else ""
    message = f"HTTP {status}" if tenant and status else type(exc).__name__ if tenant else _message(exc)
    if any(m in text for m in ("Invalid Access Key", "credential error", "Unable to decode service account")):
        return SourceError(Reason.SECRET_INVALID, f"{label}: the credentials cannot be used: {message}")
    if "token request" in text or "computeMetadata" in text or "/metadata/identity" in text:
        if not ambient:
            return SourceError(Reason.UNAUTHORIZED, f"{label}: no token for the Secret's credentials: {message}")
        return SourceError(
            Reason.NO_CREDENTIALS,
            f"{label}: no usable ambient credentials (name a Secret in spec.storage.key, or give the node or "
            f"pod an identity): {message}",
        )
    if code in ("ContainerNotFound", "NoSuchBucket") or "no bucket named" in text or (listing and status == 404):
        return SourceError(Reason.BUCKET_NOT_FOUND, f"{label}: the bucket or container does not exist")
    if code in ("BlobNotFound", "NoSuchKey") or status == 404:
        return SourceError(Reason.OBJECT_NOT_FOUND, f"{label}: not found (deleted after the listing?)")
    if "signBlob" in text or "delegation" in text.lower() or "Error signing" in text:
        return SourceError(Reason.SIGNING_FAILED, f"{label}: could not sign a URL with these credentials: {message}")
    if code in ("AuthenticationFailed", "InvalidAuthenticationInfo", "ExpiredToken") or status == 401:
        return SourceError(Reason.UNAUTHORIZED, f"{label}: credentials rejected ({code or status})")
    if status == 403 or code.startswith("Authorization") or code == "AccessDenied":
        return SourceError(Reason.ACCESS_DENIED, f"{label}: access denied ({code or status})")
    if status in (429, 503) or code in ("ServerBusy", "SlowDown"):
        return SourceError(Reason.RATE_LIMITED, f"{label}: the store asked to slow down ({code or status})")
    if not status and ("error sending request" in text or "Connect" in text or "dns error" in text):
        return SourceError(Reason.SOURCE_UNREACHABLE, f"{label}: {message}")
    return SourceError(Reason.SOURCE_ERROR, f"{label}: {message}")


class CloudSource(ObjectStoreFetch):
    """The ``gs://`` and ``az://`` source; one instance serves every such model of the agent (stores are cached)."""

    def __init__(
        self,
        *,
        sign_expiry_s: int = DEFAULT_SIGN_EXPIRY_S,
        **tuning: Unpack[StoreTuning],
    ) -> None:
        super().__init__(**tuning)
        self.sign_expiry_s = sign_expiry_s
        self._stores: dict[tuple[Any, ...], GCSStore | AzureStore] = {}

    def store(self, settings: CloudSettings) -> GCSStore | AzureStore:
        cache_key = (
            settings.scheme,
            settings.account,
            settings.bucket,
            settings.endpoint,
            settings.anonymous,
            tuple(sorted(settings.credentials.items())),
            settings.guard,
        )
        cached = self._stores.get(cache_key)
        if cached is not None:
            return cached
        from obstore.store import AzureStore, GCSStore

        client: dict[str, Any] = {
            "allow_http": settings.endpoint.startswith("http://"),
            "connect_timeout": timedelta(seconds=20),
            "timeout": timedelta(seconds=120),
        }
        retry: dict[str, Any] = {"max_retries": 4, "retry_timeout": timedelta(seconds=60)}
        config: dict[str, Any] = dict(settings.credentials)
        if settings.anonymous:
            config["skip_signature"] = True
        provider = _tenant_azure_provider(settings, config)
        store: GCSStore | AzureStore
        if settings.scheme == GCS:
            if settings.endpoint_given:
                config["base_url"] = settings.endpoint
            store = GCSStore(settings.bucket, config=config, client_options=client, retry_config=retry)  # type: ignore[arg-type]
        else:
            config["account_name"] = settings.account
            if settings.endpoint_given:
                config["endpoint"] = settings.endpoint
            store = AzureStore(
                settings.bucket,
                config=config,  # type: ignore[arg-type]
                client_options=client,  # type: ignore[arg-type]
                retry_config=retry,  # type: ignore[arg-type]
                credential_provider=provider,
            )
        if len(self._stores) >= _STORE_CACHE_SIZE:
            self._stores.pop(next(iter(self._stores)))
        self._stores[cache_key] = store
        return store

    async def list_objects(self, store: GCSStore | AzureStore, settings: CloudSettings) -> list[RemoteObject]:
        import obstore

        objects: list[RemoteObject] = []
        budget = ListingBudget(settings.label())
        # object_store lists by path segments: "a/b" lists a/b/..., never a/bc.
        stream = obstore.list(store, prefix=settings.prefix.rstrip("/") or None, chunk_size=1000)
        async for chunk in stream:
            budget.page()
            for meta in chunk:
                budget.item(str(meta["path"]))
                etag = str(meta.get("e_tag") or "")
                md5 = md5_from_etag(etag) if settings.scheme == GCS else None  # for adopting files in place
                obj = listed_object(str(meta["path"]), int(meta["size"]), etag, settings.prefix, md5)
                if obj is not None:
                    objects.append(obj)
        return objects

    def signer(self, store: GCSStore | AzureStore, settings: CloudSettings) -> SignedUrls:
        expiry = timedelta(seconds=self.sign_expiry_s)
        sas = settings.credentials.get("sas_key")

        async def sign(key: str) -> str:
            if settings.anonymous:
                return settings.object_url(key)
            if sas:  # a SAS is already a signature: obstore cannot sign with it, and need not
                return f"{settings.object_url(key)}?{sas}"
            import obstore

            try:
                return await obstore.sign_async(store, "GET", key, expiry)
            except Exception as exc:
                raise classify(
                    exc, settings.label(key), listing=False, ambient=settings.ambient, tenant=settings.guard is not None
                ) from exc

        return SignedUrls(sign, SIGN_RENEW_S)

    async def fetch(self, request: FetchRequest) -> FetchResult:
        settings = settings_for(request)
        progress = Progress(phase="scanning")
        request.on_progress(progress)
        tenant = settings.guard is not None
        if settings.guard is not None:  # before obstore (which resolves on its own) is given the host
            await asyncio.to_thread(settings.guard.check_endpoint, settings.endpoint)
        try:
            store = self.store(settings)
            objects = await self.list_objects(store, settings)
        except SourceError:
            raise
        except Exception as exc:
            raise classify(exc, settings.label(), listing=True, ambient=settings.ambient, tenant=tenant) from exc
        if not objects:
            raise SourceError(Reason.NO_OBJECTS, f"no objects found under {settings.label()}")
        signer = self.signer(store, settings)

        async with probe_session(settings.guard) as session:

            async def prepare(obj: RemoteObject) -> ObjectGet:
                url = signer.for_key(obj.key)
                if obj.size == 0:
                    return ObjectGet(Expected(size=0, validator=obj.etag or None), url)
                tenant = settings.guard is not None
                expected = await probe(session, await url(), obj, settings.label(obj.key), follow_redirects=not tenant)
                return ObjectGet(expected, url)

            return await self.fetch_objects(request, objects, label=settings.label, progress=progress, prepare=prepare)


def _tenant_azure_provider(settings: CloudSettings, config: dict[str, Any]) -> Any:
    """For a tenant's Azure key or SAS: an explicit credential provider (outranks the environment), else None.

    The key is taken out of ``config`` (the provider carries it).
    """
    if settings.guard is None or settings.scheme != AZURE:
        return None
    if key := config.pop("account_key", None):
        return lambda: {"access_key": key, "expires_at": None}
    if sas := config.pop("sas_key", None):
        pairs = urllib.parse.parse_qsl(sas, keep_blank_values=True)
        return lambda: {"sas_token": pairs, "expires_at": None}
    return None


@contextlib.asynccontextmanager
async def probe_session(guard: Guard | None = None) -> AsyncIterator[aiohttp.ClientSession]:
    """The HTTP session of one fetch's probes: headers as stored (no decompression), proxies from the environment.

    For a tenant model its hosts are resolved through the guard (forbidden addresses refused, the checked
    address connected to).
    """
    connector = aiohttp.TCPConnector(resolver=guard.aiohttp_resolver()) if guard is not None else None
    async with aiohttp.ClientSession(
        auto_decompress=False, trust_env=True, skip_auto_headers=("Accept-Encoding",), connector=connector
    ) as session:
        yield session


async def probe(
    session: aiohttp.ClientSession, url: str, obj: RemoteObject, label: str, *, follow_redirects: bool = True
) -> Expected:
    """A one-byte ranged GET on the signed URL: what the store says about the whole object (see the module doc)."""
    try:
        async with session.get(
            url,
            headers={"Range": "bytes=0-0"},
            timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
            allow_redirects=follow_redirects,
        ) as resp:
            if resp.status not in (200, 206):
                raise _probe_error(resp.status, label)
            return expected_from_probe(resp.status, resp.headers, obj)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SourceError(Reason.SOURCE_UNREACHABLE, f"{label}: {type(exc).__name__}") from exc


def _probe_error(status: int, label: str) -> SourceError:
    known = status_error(status, label, f"HTTP {status}", slow_down=(429, 503))  # Azure says ServerBusy with 503
    return known or SourceError(Reason.SOURCE_ERROR, f"{label}: unexpected HTTP {status}")
