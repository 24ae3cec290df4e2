"""A real GCS API (fake-gcs-server) on loopback, for the ``gs://`` source's tests.

Role: the GCS origin the end-to-end tests fetch from. fake-gcs-server (Go, pinned to
:data:`FAKE_GCS_VERSION`) is built from its Go module into ``~/.cache/model-agent/fake-gcs-server/<version>/``
by ``python -m testbed build --with-emulators`` (CI's setup), or on first use. It serves the JSON API (used
here to create buckets and upload) and the XML API obstore lists, reads and signs URLs for: listing with
prefixes, ranged GET, ``If-Match`` on the ETag, ``x-goog-hash`` with the MD5. It checks no credentials, so
a wrong key cannot be detected against it (Azurite does check them).

Quirks seen with 1.56.1 (2026-11): ETags are the base64 MD5 (real GCS: hex MD5 in the XML API); a missing
bucket answers 500 "no bucket named ..." (real GCS: 404 ``NoSuchBucket``); obstore's XML ``PUT`` is refused,
hence uploads through the JSON API.

Contract: :class:`FakeGcsServer` starts on a free ``127.0.0.1`` port with in-memory storage (gone when it
stops); :attr:`~FakeGcsServer.endpoint` is the ``endpoint`` parameter for ``gs://`` models.
:func:`create_bucket`, :func:`upload_objects` fill it; :func:`service_account_key` makes a throw-away key
that obstore can sign URLs with.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from testbed.servers import controlplane as cp
from testbed.servers.service import LocalProcess, send_create_request

FAKE_GCS_VERSION = "v1.56.1"
FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"


class FakeGcsError(Exception):
    """A failure a person can act on; the message is one line that says what to do."""


def binary_path() -> Path:
    """Where the built fake-gcs-server binary is cached, per version."""
    return cp.cache_root() / "fake-gcs-server" / FAKE_GCS_VERSION / "fake-gcs-server"


def build_fake_gcs(*, echo: cp.Echo = cp._noop) -> Path:
    """``go install`` the pinned fake-gcs-server into the cache unless it is there."""
    return cp.go_install(FAKE_GCS_MODULE, FAKE_GCS_VERSION, binary_path(), echo=echo)


class FakeGcsServer(LocalProcess):
    """fake-gcs-server over plain HTTP on loopback; ``with FakeGcsServer(dir) as gcs:`` and :attr:`endpoint`."""

    name = "fake-gcs-server"
    error = FakeGcsError
    ready_path = "/storage/v1/b"  # the bucket listing

    def argv(self, port: int) -> list[str]:
        """The server on loopback with an in-memory backend, its public URLs pointing at itself."""
        return [
            str(binary_path()),
            *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory"),
            *("-public-host", f"127.0.0.1:{port}", "-external-url", f"http://127.0.0.1:{port}"),
            *("-log-level", "warn"),
        ]

    def prepare(self) -> None:
        """Build fake-gcs-server into the cache on first use (CI's setup does it ahead)."""
        try:
            build_fake_gcs()
        except cp.ControlPlaneError as exc:
            raise FakeGcsError(str(exc)) from exc


def create_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket``; an existing one is fine."""
    body = json.dumps({"name": bucket}).encode()
    req = urllib.request.Request(
        f"{endpoint}/storage/v1/b", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    send_create_request(req)


def upload_objects(endpoint: str, bucket: str, objects: Mapping[str, bytes]) -> dict[str, str]:
    """Upload ``objects`` (name -> bytes) with single media uploads; return each name's ``md5Hash`` (base64)."""
    hashes: dict[str, str] = {}
    for name, data in objects.items():
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        req = urllib.request.Request(
            f"{endpoint}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?{query}",
            data=data,
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            hashes[name] = str(json.loads(resp.read())["md5Hash"])
    return hashes


def service_account_key(email: str = "model-agent@test.iam.gserviceaccount.com") -> str:
    """A service account key file (JSON) with a fresh RSA key: enough for obstore to sign URLs."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    doc = {
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "test",
        "private_key": pem,
        "client_email": email,
        "token_uri": "http://127.0.0.1:9/token",  # never used: obstore signs its own JWTs for keys
    }
    return json.dumps(doc)
