"""``s3://bucket[@region]/prefix`` — S3 and S3-compatible object stores (MinIO, Ceph RGW, R2, moto, ...).

Role: turn every object under a prefix into a verified file in staging, fetching only what the previous
manifest does not already hold. boto3 does the control plane (listing, HEAD, presigning); the bytes move
through :mod:`model_agent.transfer` on presigned GET URLs (parallel ranges, resumable part map,
bounded memory, ``If-Match`` on the ETag so an object replaced mid-download is noticed). URLs are signed for
one hour and renewed every ten minutes, since a URL signed with temporary credentials (IRSA, instance roles)
dies with them; signing runs in a worker thread when the SDK's chain may refresh credentials over the network,
else in the event loop (:func:`_signer`). Other blocking boto3 calls run in threads; cancellation takes effect at
the next ``await`` (a LIST or HEAD page in progress finishes first).

Layout (docs/ome-compatibility.md#24-on-disk-layout, as OCI): the prefix is taken as a folder (a trailing ``/`` is
added unless it is empty,
which means the whole bucket); object ``P/a/b`` becomes ``dest/a/b``. Zero-byte keys ending in ``/``
(folder markers) are skipped. A key that would not be a plain relative path under ``dest`` (``..``, ``.``,
empty segments, NUL), a key under ``.cache/`` (the staging bookkeeping folder), and two keys where one is a
file and the other a folder of the same name are refused (``UnsafeFilePath``, not retried). No objects is
``NoObjects``.

Parameters (``spec.storage.parameters``):

* ``endpoint`` — the S3 API URL for non-AWS stores (``http://minio.storage:9000``); default AWS.
* ``region`` — the signing region; else the ``@region`` of the URI, else ``AWS_REGION`` / the SDK default.
* ``addressingStyle`` — ``auto`` (default), ``path`` or ``virtual``; most S3-compatible stores want ``path``.
* ``anonymous`` — ``"true"``: unsigned requests (public buckets); no credentials are looked up.

Credentials: the Secret named by ``spec.storage.key`` (read by the caller into ``FetchRequest.secret``) with
data keys ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+ optional ``AWS_SESSION_TOKEN``), or
``accessKeyId`` + ``secretAccessKey`` (+ ``sessionToken``). A named Secret without either pair is
``SecretInvalid``. Without a Secret, the SDK's default chain applies (environment, web identity / IRSA,
EKS Pod Identity, ECS, instance metadata, shared config files) — for trusted models only.

Tenant models (a BaseModel outside the trusted namespaces, :mod:`model_agent.sources.egress`): without a
Secret the requests are unsigned (the node's chain is never consulted); ``endpoint`` must be on the allow-list
(``EndpointRefused``); every request the SDK sends is checked first (``before-send``: its URL against the
allow-list, its host's addresses against the address rules) and the presigned GETs go through the engine's
checked connections; error reasons carry status and error code only, never the store's message. Residual
risk: botocore resolves the host again when it connects, so a host whose DNS the tenant controls could
rebind between the check and the connection — which is why only hosts on the admin's allow-list are
reachable at all (by default the AWS endpoints, whose DNS no tenant controls). botocore follows no HTTP
redirect (its region redirector re-targets the same endpoint, and that request is checked too).

Verification, per object, from a ``HEAD`` with checksum mode on (an object the engine fetches in one request,
up to 4 MiB: from its ``GET``'s own headers instead, the URL signed with checksum mode and pinned to the listed
ETag by ``If-Match``, so a small file costs one request, by the same rules): the size always; MD5 when the ETag is one
(single-part upload: 32 hex digits without ``-N``, and not SSE-KMS/SSE-C, whose ETags are not MD5s); the
``x-amz-checksum-crc32`` / ``-sha1`` / ``-sha256`` value when it describes the whole object (``ChecksumType``
``FULL_OBJECT``, or a single-part object; a multipart ETag ``-N`` with no type is treated as composite,
which moto 5.2.5 returns for multipart uploads without marking it so); for multipart objects without one,
an ``md5chksum`` user-metadata value (base64, as rclone writes it). Anything else is checked by size only.
CRC32C and CRC64NVME are not computed (no library in the standard set). sha256 is always computed, for the
manifest and later ``verify`` passes.

Reuse: a file of the previous manifest at the same path with the same size and ETag that is intact on disk
is kept without a request (a second fetch of an unchanged prefix is one LIST). A file in ``dest`` without a
record (a kill between publish and manifest) is adopted when its MD5 equals a single-part ETag. Partial
downloads in staging resume from their part maps (``staging/.cache/model-agent/parts/``, removed by
``publish``); stray files in staging that are not wanted are removed first, so they can never be published.

Disk: before any transfer, the bytes still to be written (object sizes minus what partial files already
occupy) are reserved in :data:`model_agent.local.capacity.REGISTRY`, which refuses with
``InsufficientDisk`` unless they fit beside the other downloads in flight and the configured reserve.

Why boto3 and not obstore (measured against moto 5.2.5 on loopback, 2026-11): both listed 1,100 keys with
pagination correctly (0.80 s vs 0.82 s) and returned the same ETags, including ``"<md5>-5"`` for a 40 MiB
multipart upload; obstore imports in 0.04 s / 17 MiB RSS against boto3's 0.4 s / 35 MiB (50 MiB with a
client). The deciding differences are not speed: obstore's ``head``/``list`` expose only path, size, ETag,
mtime and version, so the agent could not see ``x-amz-checksum-*`` values, their ``ChecksumType``, or SSE-KMS
(whose ETag is not an MD5, so checking it as one would fail good objects); and boto3 carries the complete AWS
credential chain and S3-compatible knobs. The transfer itself is the ranged engine either way, so the choice
costs no throughput; boto3 is imported lazily (first S3 fetch), so nodes without S3 models do not pay its
memory. Throughput must be measured against an nginx origin (``bench/ranged.py``,
docs/performance.md#8-the-download-benchmark),
never moto (about 0.3 GB/s for one stream here, and CPU-bound in Python).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

from model_agent.model.reasons import Reason
from model_agent.model.uris import parse_s3_uri
from model_agent.sources import objects as store
from model_agent.sources.base import FetchRequest, FetchResult, Progress, SourceError
from model_agent.sources.egress import CredentialUse, Guard, credential_for, current, guard_for
from model_agent.sources.listing import ListingBudget
from model_agent.transfer import Expected, b64_to_hex, fetched_in_one_request

if TYPE_CHECKING:
    import boto3.session
    from types_boto3_s3.client import S3Client
    from types_boto3_s3.type_defs import HeadObjectOutputTypeDef

PARAM_ENDPOINT = "endpoint"
PARAM_REGION = "region"
PARAM_ADDRESSING = "addressingStyle"
PARAM_ANONYMOUS = "anonymous"
SECRET_KEY_PAIRS = (
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    ("accessKeyId", "secretAccessKey", "sessionToken"),
)
DEFAULT_PRESIGN_EXPIRY_S = 3600
PRESIGN_RENEW_S = 600.0
_MD5_ETAG = re.compile(r"[0-9a-f]{32}")
_ENDPOINT = re.compile(r"https?://[^/\s?#@]+(/[^\s?#]*)?")
_ERROR_CODE = re.compile(r"[A-Za-z0-9.]{1,64}")
_CLIENT_CACHE_SIZE = 16
# HEAD field, our algorithm name, hex length: checksums we can compute over a whole object.
_WHOLE_OBJECT_CHECKSUMS = (
    ("ChecksumCRC32", "crc32", 8),
    ("ChecksumCRC32C", "crc32c", 8),
    ("ChecksumSHA1", "sha1", 40),
    ("ChecksumSHA256", "sha256", 64),
)


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never print the secret
        return f"S3Credentials(access_key_id={self.access_key_id[:4]}...)"


@dataclass(frozen=True)
class S3Settings:
    bucket: str
    prefix: str  # "" (whole bucket) or ends with "/"
    region: str | None
    endpoint: str | None
    addressing_style: str
    anonymous: bool
    credentials: S3Credentials | None
    guard: Guard | None = None  # a tenant model's rules (sources/egress.py); None: trusted

    def label(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key or self.prefix}"


def credentials_from_secret(data: Mapping[str, str] | None) -> S3Credentials | None:
    """The access key pair in a Secret's data (see the module doc), None for no Secret; SecretInvalid else."""
    if data is None:
        return None
    for key_id, secret, token in SECRET_KEY_PAIRS:
        if data.get(key_id) and data.get(secret):
            return S3Credentials(data[key_id], data[secret], data.get(token) or None)
    raise SourceError(
        Reason.SECRET_INVALID,
        "the Secret named by spec.storage.key has neither AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY nor "
        "accessKeyId + secretAccessKey",
    )


def settings_for(request: FetchRequest) -> S3Settings:
    """Bucket, prefix, endpoint, region, addressing and credentials of one fetch, or a SourceError."""
    uri = store.parsed_uri(parse_s3_uri, request)
    params = request.parameters
    style = (params.get(PARAM_ADDRESSING) or "auto").strip().lower()
    if style not in ("auto", "path", "virtual"):
        raise SourceError(
            Reason.INVALID_PARAMETER,
            f"parameters.{PARAM_ADDRESSING} must be auto, path or virtual, not {style!r}",
            retryable=False,
        )
    endpoint = (params.get(PARAM_ENDPOINT) or "").strip() or None
    # The whole value must be a URL (re.match validated only a prefix: "http://a b" passed).
    if endpoint is not None and not _ENDPOINT.fullmatch(endpoint):
        raise SourceError(
            Reason.INVALID_PARAMETER,
            f"parameters.{PARAM_ENDPOINT} must be an http(s) URL, not {endpoint[:200]!r}",
            retryable=False,
        )
    guard = guard_for(request.owner)
    if guard is not None and endpoint is not None:
        guard.check_allowed(endpoint)
    asked_anonymous = (params.get(PARAM_ANONYMOUS) or "").strip().lower() in ("true", "1", "yes")
    use = credential_for(request.owner, current(), has_secret=request.secret is not None, anonymous=asked_anonymous)
    anonymous = use == CredentialUse.ANONYMOUS
    return S3Settings(
        bucket=uri.bucket,
        prefix=store.folder_prefix(uri.prefix),
        region=(params.get(PARAM_REGION) or "").strip() or uri.region or None,
        endpoint=endpoint,
        addressing_style=style,
        anonymous=anonymous,
        credentials=None if anonymous else credentials_from_secret(request.secret),
        guard=guard,
    )


def md5_of_etag(etag: str) -> str | None:
    """The MD5 an ETag may be: 32 hex digits of a single-part upload (SSE-KMS/SSE-C are not told by a listing)."""
    raw = etag.strip('"').lower()
    return raw if _MD5_ETAG.fullmatch(raw) else None


def expected_from_head(head: HeadObjectOutputTypeDef | Mapping[str, Any]) -> Expected:
    """What a HEAD (with ``ChecksumMode=ENABLED``) lets us check about the object; see the module doc."""
    size = int(head["ContentLength"])
    etag = str(head["ETag"])
    raw = etag.strip('"').lower()
    multipart = "-" in raw
    checksums: dict[str, str] = {}
    encrypted = head.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse") or bool(
        head.get("SSECustomerAlgorithm")
    )
    if not multipart and not encrypted and _MD5_ETAG.fullmatch(raw):
        checksums["md5"] = raw
    checksum_type = head.get("ChecksumType")
    if checksum_type == "FULL_OBJECT" or (checksum_type is None and not multipart):
        for field_name, alg, length in _WHOLE_OBJECT_CHECKSUMS:
            value = head.get(field_name)
            hexed = b64_to_hex(value) if isinstance(value, str) and "-" not in value else None
            if hexed is not None and len(hexed) == length:
                checksums[alg] = hexed
    if multipart and "md5" not in checksums:
        meta = head.get("Metadata") or {}
        claimed = meta.get("md5chksum") if isinstance(meta, Mapping) else None
        hexed = b64_to_hex(claimed) if isinstance(claimed, str) else None
        if hexed is not None and len(hexed) == 32:
            checksums["md5"] = hexed
    return Expected(size=size, checksums=checksums, validator=etag)


# The response headers of a GET with checksum mode that say what the object is, as the HEAD fields they match.
_ANSWER_FIELDS = (
    ("x-amz-server-side-encryption", "ServerSideEncryption"),
    ("x-amz-server-side-encryption-customer-algorithm", "SSECustomerAlgorithm"),
    ("x-amz-checksum-type", "ChecksumType"),
    ("x-amz-checksum-crc32", "ChecksumCRC32"),
    ("x-amz-checksum-crc32c", "ChecksumCRC32C"),
    ("x-amz-checksum-sha1", "ChecksumSHA1"),
    ("x-amz-checksum-sha256", "ChecksumSHA256"),
)
CHECKSUM_MODE_HEADER = {"x-amz-checksum-mode": "ENABLED"}  # signed into the URL: sent with every GET of it


def checksums_of_answer(size: int, etag: str) -> Callable[[Mapping[str, str]], Mapping[str, str]]:
    """What a whole GET's answer (checksum mode on; headers lowercased) lets us check, by the same rules as a
    HEAD (:func:`expected_from_head`): the answer is for the listed ETag (``If-Match``), so it describes it."""

    def stated(headers: Mapping[str, str]) -> Mapping[str, str]:
        head: dict[str, Any] = {"ContentLength": size, "ETag": etag}
        for header, field_name in _ANSWER_FIELDS:
            if header in headers:
                head[field_name] = headers[header]
        if "x-amz-meta-md5chksum" in headers:
            head["Metadata"] = {"md5chksum": headers["x-amz-meta-md5chksum"]}
        return expected_from_head(head).checksums

    return stated


def _classify(exc: BaseException, label: str, *, tenant: bool = False) -> SourceError:
    """A boto error as a reason. For a tenant model no text the store sent: status and a short error code only."""
    from botocore import exceptions as bx

    if isinstance(exc, SourceError):
        return exc
    detail = type(exc).__name__ if tenant else str(exc)[:300]
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return SourceError(Reason.NO_CREDENTIALS, f"{label}: no AWS credentials: name a Secret in spec.storage.key")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return SourceError(Reason.SOURCE_UNREACHABLE, f"{label}: {detail}")
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        if tenant and not _ERROR_CODE.fullmatch(code):
            code = ""
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "NoSuchBucket":
            return SourceError(Reason.BUCKET_NOT_FOUND, f"{label}: the bucket does not exist")
        if code in ("NoSuchKey", "404") or status == 404:
            return SourceError(Reason.OBJECT_NOT_FOUND, f"{label}: not found (it was deleted after the listing?)")
        if code in (
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
            "InvalidToken",
            "TokenRefreshRequired",
        ):
            return SourceError(Reason.UNAUTHORIZED, f"{label}: credentials rejected ({code})")
        if code == "AccessDenied" or status == 403:
            return SourceError(Reason.ACCESS_DENIED, f"{label}: access denied")
        if code in ("SlowDown", "ServiceUnavailable", "RequestLimitExceeded") or status in (429, 503):
            return SourceError(Reason.RATE_LIMITED, f"{label}: the store asked to slow down ({code or status})")
        message = "" if tenant else f": {error.get('Message', '')}"
        return SourceError(Reason.SOURCE_ERROR, f"{label}: {code or 'HTTP ' + str(status)}{message}"[:400])
    if isinstance(exc, bx.BotoCoreError):
        return SourceError(Reason.SOURCE_ERROR, f"{label}: {type(exc).__name__}: {detail}")
    return SourceError(Reason.SOURCE_ERROR, f"{label}: {type(exc).__name__}: {detail}")


def _signer(presign: Callable[[str], str], settings: S3Settings) -> Callable[[str], Awaitable[str]]:
    """``presign`` as :class:`~model_agent.sources.objects.SignedUrls` calls it. Signing is local, but credentials
    of the SDK's chain may be temporary and refreshed first (a network call): in a thread. Unsigned requests and a
    Secret's keys never refresh: signed in the event loop (about 0.1-0.2 ms; a thread hop per object cost more)."""
    if settings.anonymous or settings.credentials is not None:

        async def inline(key: str) -> str:
            return presign(key)

        return inline
    return lambda key: asyncio.to_thread(presign, key)


class S3Source(store.ObjectStoreFetch):
    """The ``s3://`` source; one instance serves every S3 model of the agent (clients are cached)."""

    def __init__(
        self,
        *,
        page_size: int = 1000,
        presign_expiry_s: int = DEFAULT_PRESIGN_EXPIRY_S,
        on_client: Callable[[S3Client], None] | None = None,
        **tuning: Unpack[store.StoreTuning],
    ) -> None:
        super().__init__(**tuning)
        self.page_size = page_size
        self.presign_expiry_s = presign_expiry_s
        self.on_client = on_client  # e.g. to register botocore event hooks (tests count requests this way)
        self._clients: dict[tuple[Any, ...], S3Client] = {}
        # One boto3 session for every client: it loads botocore's S3 service model once. A session per client
        # cost about 60 ms and 10-12 MiB each (measured: 5 sessions, 61 -> 105 MiB RSS; 5 clients of one
        # session, 4 ms each and no growth). Credentials stay per client (passed to it, never set on the
        # session), and so do the event hooks (the tenant guard): botocore copies the emitter per client.
        # Client creation from one session is not thread-safe: under the lock.
        self._session: boto3.session.Session | None = None
        self._session_lock = threading.Lock()

    # ------------------------------------------------------------------ boto3 (blocking; run in threads)

    def client(self, settings: S3Settings) -> S3Client:
        creds = settings.credentials
        cache_key = (
            settings.endpoint,
            settings.region,
            settings.addressing_style,
            settings.anonymous,
            (creds.access_key_id, creds.secret_access_key, creds.session_token) if creds else None,
            settings.guard,
        )
        cached = self._clients.get(cache_key)
        if cached is not None:
            return cached
        import boto3
        import botocore
        from botocore.config import Config

        config = Config(
            signature_version=botocore.UNSIGNED if settings.anonymous else "s3v4",
            s3={"addressing_style": settings.addressing_style},  # type: ignore[arg-type]
            retries={"mode": "standard", "max_attempts": 5},
            connect_timeout=20,
            read_timeout=60,
        )
        with self._session_lock:
            if self._session is None:
                self._session = boto3.session.Session()
            client = self._session.client(
                "s3",
                endpoint_url=settings.endpoint,
                region_name=settings.region,
                config=config,
                aws_access_key_id=creds.access_key_id if creds else None,
                aws_secret_access_key=creds.secret_access_key if creds else None,
                aws_session_token=creds.session_token if creds else None,
            )
        if settings.guard is not None:
            guard = settings.guard

            def check_request(request: Any, **_: Any) -> None:  # every request, retries included, before it goes
                guard.check_endpoint(str(request.url), "the S3 request URL")

            client.meta.events.register("before-send.s3", check_request)
        if self.on_client is not None:
            self.on_client(client)
        if len(self._clients) >= _CLIENT_CACHE_SIZE:
            self._clients.pop(next(iter(self._clients)))
        self._clients[cache_key] = client
        return client

    def list_objects(self, client: S3Client, settings: S3Settings) -> list[store.RemoteObject]:
        objects: list[store.RemoteObject] = []
        budget = ListingBudget(settings.label())
        paginator = client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=settings.bucket, Prefix=settings.prefix, PaginationConfig={"PageSize": self.page_size}
        )
        for page in pages:
            budget.page()
            for item in page.get("Contents", []):
                budget.item(str(item["Key"]))
                etag = str(item.get("ETag", ""))
                obj = store.listed_object(
                    item["Key"], int(item.get("Size", 0)), etag, settings.prefix, md5_of_etag(etag)
                )
                if obj is not None:
                    objects.append(obj)
        return objects

    # ------------------------------------------------------------------ fetch

    async def fetch(self, request: FetchRequest) -> FetchResult:
        settings = settings_for(request)
        progress = Progress(phase="scanning")
        request.on_progress(progress)
        try:
            client = await asyncio.to_thread(self.client, settings)
            objects = await asyncio.to_thread(self.list_objects, client, settings)
        except Exception as exc:
            raise _classify(exc, settings.label(), tenant=settings.guard is not None) from exc
        if not objects:
            raise SourceError(Reason.NO_OBJECTS, f"no objects found under {settings.label()}")

        def presign(key: str) -> str:
            return client.generate_presigned_url(
                "get_object", Params={"Bucket": settings.bucket, "Key": key}, ExpiresIn=self.presign_expiry_s
            )

        def presign_checked(key: str) -> str:  # the GET then returns the object's checksums (sent on HEAD otherwise)
            params = {"Bucket": settings.bucket, "Key": key, "ChecksumMode": "ENABLED"}
            return client.generate_presigned_url("get_object", Params=params, ExpiresIn=self.presign_expiry_s)

        presigner = store.SignedUrls(_signer(presign, settings), PRESIGN_RENEW_S)
        checked = store.SignedUrls(_signer(presign_checked, settings), PRESIGN_RENEW_S)

        async def prepare(obj: store.RemoteObject) -> store.ObjectGet:
            if fetched_in_one_request(obj.size, self.ranged.part_size):
                # One request: the GET's own headers say what a HEAD would (If-Match pins it to the listing).
                expected = Expected(
                    obj.size, validator=obj.etag, checksums_from_answer=checksums_of_answer(obj.size, obj.etag)
                )
                return store.ObjectGet(expected, checked.for_key(obj.key), CHECKSUM_MODE_HEADER)
            try:
                head = await asyncio.to_thread(
                    client.head_object, Bucket=settings.bucket, Key=obj.key, ChecksumMode="ENABLED"
                )
            except Exception as exc:
                raise _classify(exc, settings.label(obj.key), tenant=settings.guard is not None) from exc
            return store.ObjectGet(expected_from_head(head), presigner.for_key(obj.key))

        return await self.fetch_objects(request, objects, label=settings.label, progress=progress, prepare=prepare)
