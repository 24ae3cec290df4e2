"""A real Azure Blob API (Azurite) on loopback, for the ``az://`` source's tests.

Role: the Azure origin the end-to-end tests fetch from. Azurite (Microsoft's emulator, Node, pinned to
:data:`AZURITE_VERSION`) is installed with npm into ``~/.cache/model-agent/azurite/<version>/`` by
``python -m testbed build --with-emulators`` (CI's setup), or on first use. It checks Shared Key and SAS
signatures with the well-known development account (:data:`ACCOUNT`, :data:`ACCOUNT_KEY`), so wrong
credentials are refused as by Azure (403 ``AuthorizationFailure``). Blobs are kept in memory.

Contract: :class:`AzuriteServer` starts the blob service on a free ``127.0.0.1`` port;
:attr:`~AzuriteServer.endpoint` (path style, account included) is the ``endpoint`` parameter for
``az://devstoreaccount1/...`` models. :func:`create_container` (one Shared-Key-signed request) and
:func:`upload_blobs` (obstore; blobs above its single-request limit become block lists, without an MD5)
fill it.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from testbed.servers import controlplane as cp
from testbed.servers.service import LocalProcess, last_line, run_step, send_create_request

AZURITE_VERSION = "3.37.0"
ACCOUNT = "devstoreaccount1"
# Azurite's published development key (the same in every installation; not a secret).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
INSTALL_TIMEOUT_S = 900
_API_VERSION = "2021-08-06"


class AzuriteError(Exception):
    """A failure a person can act on; the message is one line that says what to do."""


def install_dir() -> Path:
    """Where Azurite's npm package is cached, per version (shared by every checkout on the machine)."""
    return cp.cache_root() / "azurite" / AZURITE_VERSION


def blob_binary() -> Path:
    """The blob service's entry point inside the cached package."""
    return install_dir() / "node_modules" / ".bin" / "azurite-blob"


def ensure_azurite(*, echo: cp.Echo = cp._noop) -> Path:
    """``npm install`` the pinned Azurite into the cache unless it is there; return ``azurite-blob``."""
    target = blob_binary()
    if target.is_file():
        echo(f"azurite {AZURITE_VERSION}: using cached install in {install_dir()}")
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise AzuriteError("npm is not on PATH: install Node.js (>= 18) and npm")
    staging = install_dir().with_name(f".{AZURITE_VERSION}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    echo(f"installing azurite {AZURITE_VERSION} with npm")
    started = time.monotonic()
    argv = [
        npm,
        "install",
        "--prefix",
        str(staging),
        "--no-audit",
        "--no-fund",
        "--omit=dev",
        f"azurite@{AZURITE_VERSION}",
    ]
    what = f"npm install of azurite {AZURITE_VERSION}"
    proc = run_step(argv, what, AzuriteError, timeout_s=INSTALL_TIMEOUT_S, on_timeout="check the network")
    if proc.returncode != 0:
        raise AzuriteError(f"{what} failed: {last_line(proc.stderr)}")
    shutil.rmtree(install_dir(), ignore_errors=True)
    staging.rename(install_dir())  # complete or absent: a killed install is redone
    echo(f"installed azurite in {time.monotonic() - started:.0f}s")
    return target


class AzuriteServer(LocalProcess):
    """Azurite's blob service on loopback; ``with AzuriteServer(dir) as az:`` and :attr:`endpoint`."""

    name = "azurite"
    error = AzuriteError
    # Its graceful shutdown (SIGTERM or SIGINT) takes 10 s here; blobs are in memory, nothing to flush.
    stop_signal = signal.SIGKILL
    endpoint_path = f"/{ACCOUNT}"  # path style: the account is the first path segment
    ready_path = f"/{ACCOUNT}?comp=list"  # the account's container listing

    def __init__(self, state_dir: Path, *, start_timeout: float = 120.0, stop_timeout: float = 10.0) -> None:
        super().__init__(state_dir, start_timeout=start_timeout, stop_timeout=stop_timeout)

    def argv(self, port: int) -> list[str]:
        """The blob service only, on loopback, in memory: nothing outlives the test."""
        return [
            str(blob_binary()),
            *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
            *("--inMemoryPersistence", "--skipApiVersionCheck", "--silent"),
        ]

    def prepare(self) -> None:
        """Install Azurite into the cache on first use (CI's setup does it ahead)."""
        ensure_azurite()


def create_container(endpoint: str, container: str, *, account_key: str = ACCOUNT_KEY) -> None:
    """Create ``container`` with one Shared Key request; an existing one is fine."""
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": _API_VERSION}
    canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    # Verb, then 11 standard headers (all empty here; a zero Content-Length is signed as empty).
    string_to_sign = "PUT\n" + "\n" * 11 + canonical_headers + f"/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"
    signature = hmac.new(base64.b64decode(account_key), string_to_sign.encode(), hashlib.sha256).digest()
    req = urllib.request.Request(
        f"{endpoint}/{container}?restype=container",
        method="PUT",
        headers={
            **headers,
            "Content-Length": "0",
            "Authorization": f"SharedKey {ACCOUNT}:{base64.b64encode(signature).decode()}",
        },
    )
    send_create_request(req)


def upload_blobs(endpoint: str, container: str, blobs: Mapping[str, bytes]) -> None:
    """Upload ``blobs`` (name -> bytes) with obstore and the development account key."""
    import obstore
    from obstore.store import AzureStore

    store = AzureStore(
        container,
        account_name=ACCOUNT,
        account_key=ACCOUNT_KEY,
        endpoint=endpoint,
        client_options={"allow_http": True},
    )
    for name, data in blobs.items():
        obstore.put(store, name, data)
