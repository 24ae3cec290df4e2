"""FakeOciObjectStorage: a local stand-in for OCI Object Storage, for tests of the ``oci://`` source.

It exists because the real OCI service cannot run here (no network beyond package registries, and no
local build of it exists). It implements exactly the Object Storage calls the agent's OCI source makes,
with the shapes the ``oci`` SDK parses, on loopback:

* ``GetNamespace`` — ``GET /n/`` → the namespace as a JSON string;
* ``ListObjects`` — ``GET /n/{ns}/b/{bucket}/o`` with ``prefix``, ``start``, ``limit`` and ``fields``
  (``name`` always; ``size``, ``md5``, ``etag`` when asked), paginated with ``nextStartWith``;
* ``HeadObject`` — ``HEAD /n/{ns}/b/{bucket}/o/{name}``: ``Content-Length``, ``ETag``, ``Content-MD5``
  (base64; single-part objects) or ``opc-multipart-md5`` (``<b64>-<parts>``; multipart ones), ``opc-meta-*``;
* ``GetObject`` — ``GET`` of the same path, with ``Range: bytes=a-b`` (206) and ``If-Match`` (412 when the
  ETag differs).

Errors have OCI's JSON body ``{"code": ..., "message": ...}`` and an ``opc-request-id`` header (404
``BucketNotFound`` / ``ObjectNotFound`` / ``NamespaceNotFound``, 401 ``NotAuthenticated``, 412
``IfMatchFailed``, 416 ``InvalidRange``). Every request must carry an OCI ``Signature`` Authorization header
signing ``date``, ``(request-target)`` and ``host``; it is verified against the public key registered for
its ``keyId`` (RSA-SHA256), and the date must be within 5 minutes. Objects are held in memory or read from
files. Every request is recorded (:attr:`FakeOciObjectStorage.requests`) so tests can assert on them.

:func:`write_user_principal` makes a throwaway API signing key pair and an SDK config file for it.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

_AUTH_PARAM = re.compile(r'(\w+)="([^"]*)"')
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
MAX_CLOCK_SKEW_S = 300


@dataclass
class FakeObject:
    """One stored object: its bytes (or the file holding them) and what HEAD reports about it."""

    data: bytes | None = None
    path: Path | None = None
    etag: str = field(default_factory=lambda: str(uuid.uuid4()))
    parts: int | None = None  # a multipart upload of this many parts: no Content-MD5
    metadata: dict[str, str] = field(default_factory=dict)  # opc-meta-*
    claimed_md5: str | None = None  # base64 MD5 reported instead of the real one (to test verification)
    _md5: str | None = field(default=None, init=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else (self.path.stat().st_size if self.path else 0)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``."""
        if self.data is not None:
            return self.data[start:end]
        assert self.path is not None
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    def md5_b64(self) -> str:
        if self.claimed_md5 is not None:
            return self.claimed_md5
        if self._md5 is None:  # computed once: objects do not change in place (put() replaces them)
            digest = hashlib.md5(self.data if self.data is not None else self.read(0, self.size)).digest()
            self._md5 = base64.b64encode(digest).decode()
        return self._md5

    def listed_md5(self) -> str:
        return f"{self.md5_b64()}-{self.parts}" if self.parts else self.md5_b64()


@dataclass(frozen=True)
class RecordedRequest:
    operation: str  # GetNamespace, ListObjects, HeadObject, GetObject, or Unknown
    method: str
    path: str  # decoded path, without the query
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    status: int
    sent_bytes: int  # body bytes written (GetObject)


@dataclass(frozen=True)
class UserPrincipal:
    """A throwaway API signing identity: the SDK config file that names it, and the key the fake checks."""

    config_path: Path
    key_id: str  # tenancy/user/fingerprint, as the SDK puts it in keyId
    public_key: rsa.RSAPublicKey
    region: str


def write_user_principal(directory: Path, *, region: str = "us-ashburn-1", profile: str = "DEFAULT") -> UserPrincipal:
    """Generate an RSA key pair and write ``config`` + ``key.pem`` for the SDK's user-principal auth."""
    directory.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    key_path = directory / "key.pem"
    key_path.write_bytes(pem)
    key_path.chmod(0o600)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    fingerprint = ":".join(f"{b:02x}" for b in hashlib.md5(der).digest())
    tenancy = "ocid1.tenancy.oc1..aaaafaketenancy"
    user = "ocid1.user.oc1..aaaafakeuser"
    config_path = directory / "config"
    config_path.write_text(
        f"[{profile}]\nuser={user}\nfingerprint={fingerprint}\ntenancy={tenancy}\nregion={region}\nkey_file={key_path}\n"
    )
    return UserPrincipal(config_path, f"{tenancy}/{user}/{fingerprint}", key.public_key(), region)


class FakeOciObjectStorage:
    """A fake OCI Object Storage server on loopback; use as a context manager. See the module doc."""

    def __init__(self, namespace: str, keys: dict[str, rsa.RSAPublicKey] | None = None) -> None:
        self.namespace = namespace
        self.keys: dict[str, rsa.RSAPublicKey] = dict(keys or {})
        self.buckets: dict[str, dict[str, FakeObject]] = {}
        self.requests: list[RecordedRequest] = []
        self.read_delay_s = 0.0  # sleep before each chunk of a GetObject body (to test cancellation)
        self.read_chunk = 1024 * 1024
        self.in_flight = 0  # requests being answered now
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ content

    def create_bucket(self, bucket: str) -> dict[str, FakeObject]:
        return self.buckets.setdefault(bucket, {})

    def put(self, bucket: str, name: str, data: bytes, **kwargs: Any) -> FakeObject:
        obj = FakeObject(data=data, **kwargs)
        self.create_bucket(bucket)[name] = obj
        return obj

    def put_directory(self, bucket: str, prefix: str, directory: Path) -> None:
        """Serve every file below ``directory`` as ``prefix + relative path`` (read when requested)."""
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            self.create_bucket(bucket)[prefix + path.relative_to(directory).as_posix()] = FakeObject(path=path)

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeOciObjectStorage:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-oci", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def record(self, entry: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(entry)
            self.in_flight -= 1

    def operations(self, operation: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.operation == operation]

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeOciObjectStorage

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ------------------------------------------------------------------ dispatch

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def _handle(self, method: str) -> None:
        fake = self.server_fake
        split = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        segments = split.path.split("/")  # "", "n", ns, "b", bucket, "o", name...
        operation = "Unknown"
        if len(segments) in (2, 3) and segments[1] == "n" and (len(segments) == 2 or segments[2] == ""):
            operation = "GetNamespace"
        elif len(segments) >= 6 and segments[1] == "n" and segments[3] == "b" and segments[5] == "o":
            operation = "ListObjects" if len(segments) == 6 or segments[6:] == [""] else "Object"
        if operation == "Object":
            operation = "HeadObject" if method == "HEAD" else "GetObject"
        self._status = 0
        self._sent = 0
        fake.started()
        try:
            problem = self._authentication_problem(method)
            if problem is not None:
                self._error(401, "NotAuthenticated", problem)
            elif operation == "GetNamespace" and method == "GET":
                self._json(200, fake.namespace)
            elif operation == "ListObjects" and method == "GET":
                self._list(unquote(segments[2]), unquote(segments[4]), query)
            elif operation in ("HeadObject", "GetObject"):
                name = unquote("/".join(segments[6:]))
                self._object(method, unquote(segments[2]), unquote(segments[4]), name)
            else:
                self._error(404, "NotFound", f"no such operation: {method} {split.path}")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            fake.record(
                RecordedRequest(
                    operation,
                    method,
                    unquote(split.path),
                    query,
                    {k.lower(): v for k, v in self.headers.items()},
                    self._status,
                    self._sent,
                )
            )

    # ------------------------------------------------------------------ authentication

    def _authentication_problem(self, method: str) -> str | None:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Signature "):
            return "the request has no OCI Signature Authorization header"
        params = dict(_AUTH_PARAM.findall(header))
        if params.get("algorithm") != "rsa-sha256" or params.get("version") != "1":
            return "unsupported signature algorithm or version"
        signed = params.get("headers", "").split()
        if not {"date", "(request-target)", "host"} <= set(signed):
            return "the signature must cover date, (request-target) and host"
        key = self.server_fake.keys.get(params.get("keyId", ""))
        if key is None:
            return "unknown keyId"
        lines = []
        for name in signed:
            if name == "(request-target)":
                lines.append(f"(request-target): {method.lower()} {self.path}")
            else:
                value = self.headers.get(name)
                if value is None:
                    return f"signed header {name} is missing"
                lines.append(f"{name}: {value}")
        try:
            key.verify(
                base64.b64decode(params.get("signature", "")),
                "\n".join(lines).encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except (InvalidSignature, ValueError):
            return "the signature does not verify"
        date = email.utils.parsedate_to_datetime(self.headers.get("date", ""))
        if abs(date.timestamp() - time.time()) > MAX_CLOCK_SKEW_S:
            return "the signed date is too far from the server's clock"
        return None

    # ------------------------------------------------------------------ operations

    def _bucket(self, namespace: str, bucket: str) -> dict[str, FakeObject] | None:
        fake = self.server_fake
        if namespace != fake.namespace:
            self._error(404, "NamespaceNotFound", f"You do not have authorization to access namespace {namespace}")
            return None
        objects = fake.buckets.get(bucket)
        if objects is None:
            self._error(
                404,
                "BucketNotFound",
                f"Either the bucket named '{bucket}' does not exist in the namespace '{namespace}' or you are "
                "not authorized to access it",
            )
        return objects

    def _list(self, namespace: str, bucket: str, query: dict[str, str]) -> None:
        objects = self._bucket(namespace, bucket)
        if objects is None:
            return
        prefix = query.get("prefix", "")
        start = query.get("start", "")
        limit = max(1, min(1000, int(query.get("limit") or 1000)))
        fields = set((query.get("fields") or "name").split(","))
        names = sorted(n for n in objects if n.startswith(prefix) and n >= start)
        page, rest = names[:limit], names[limit:]
        items = []
        for name in page:
            obj = objects[name]
            item: dict[str, Any] = {"name": name}
            if "size" in fields:
                item["size"] = obj.size
            if "md5" in fields:
                item["md5"] = obj.listed_md5()
            if "etag" in fields:
                item["etag"] = obj.etag
            items.append(item)
        body: dict[str, Any] = {"objects": items, "prefixes": []}
        if rest:
            body["nextStartWith"] = rest[0]
        self._json(200, body)

    def _object(self, method: str, namespace: str, bucket: str, name: str) -> None:
        objects = self._bucket(namespace, bucket)
        if objects is None:
            return
        obj = objects.get(name)
        if obj is None:
            self._error(404, "ObjectNotFound", f"The object '{name}' was not found in the bucket '{bucket}'")
            return
        if_match = self.headers.get("If-Match")
        if if_match is not None and if_match.strip('"') != obj.etag:
            self._error(412, "IfMatchFailed", "The If-Match header does not match the current ETag")
            return
        headers = {"ETag": obj.etag, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if obj.parts:
            headers["opc-multipart-md5"] = obj.listed_md5()
        else:
            headers["Content-MD5"] = obj.md5_b64()
        for key, value in obj.metadata.items():
            headers[f"opc-meta-{key}"] = value
        size = obj.size
        if method == "HEAD":
            self._send(200, {**headers, "Content-Length": str(size)})
            return
        start, end, status = 0, size, 200
        requested = self.headers.get("Range")
        if requested is not None:
            m = _RANGE.fullmatch(requested.strip())
            if m is None or int(m[1]) >= size:
                self._error(416, "InvalidRange", f"The requested range {requested} is not satisfiable")
                return
            start = int(m[1])
            end = min(size, int(m[2]) + 1) if m[2] else size
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._send(status, {**headers, "Content-Length": str(end - start)})
        fake = self.server_fake
        pos = start
        while pos < end:
            if fake.read_delay_s:
                time.sleep(fake.read_delay_s)
            chunk = obj.read(pos, min(end, pos + fake.read_chunk))
            self.wfile.write(chunk)
            pos += len(chunk)
            self._sent += len(chunk)

    # ------------------------------------------------------------------ responses

    def _send(self, status: int, headers: dict[str, str]) -> None:
        self._status = status
        self.send_response(status)
        self.send_header("opc-request-id", uuid.uuid4().hex.upper())
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self._send(status, {"Content-Type": "application/json", "Content-Length": str(len(data))})
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"code": code, "message": message}).encode()
        self._send(status, {"Content-Type": "application/json", "Content-Length": str(len(data))})
        if self.command != "HEAD":
            self.wfile.write(data)
