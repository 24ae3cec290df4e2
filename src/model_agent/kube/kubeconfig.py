"""Where the API server is and how to authenticate to it, without the Kubernetes client library.

Role: read the in-cluster service account or a kubeconfig into :class:`Credentials` (server URL, TLS
material, an ``Authorization`` header source), for :mod:`model_agent.kube.client` to build its HTTP session
from. Importing ``kubernetes_asyncio`` costs about 35 MiB of RSS (its package imports every API model); the
agent needs a URL, a TLS context and a bearer token, so the common cases are read here and the library is
imported only for what this module does not implement.

Contract:

* :func:`in_cluster` follows the service-account convention: ``KUBERNETES_SERVICE_HOST`` /
  ``KUBERNETES_SERVICE_PORT`` (an IPv6 host is bracketed), the CA and token files under
  ``/var/run/secrets/kubernetes.io/serviceaccount``. It returns None when any of them is missing or empty,
  so the caller falls back to a kubeconfig (as the library's loader does).
* :func:`plan` is pure: a parsed kubeconfig, the directory its relative paths are relative to, and an
  optional context name in; :class:`Credentials` or :class:`NeedsLibrary` (with the reason) out. It handles
  ``server``, ``certificate-authority(-data)``, ``insecure-skip-tls-verify``, ``client-certificate(-data)``,
  ``client-key(-data)``, ``token`` and ``tokenFile`` (``token`` wins, as in the library; TLS fields are read
  for ``https`` servers only). ``exec`` and ``auth-provider`` plugins, basic auth, ``tls-server-name`` and
  ``proxy-url`` are :class:`NeedsLibrary`: the caller keeps the library's behaviour for them unchanged.
  A malformed kubeconfig (no such context, cluster or server) raises :class:`KubeconfigError`.
* A token read from a file (in-cluster or ``tokenFile``) is re-read when it is a minute old, so a rotated
  projected token is picked up (the library's in-cluster period).
* :func:`ssl_context` builds the TLS context: the given CA only when one is given, else the system's;
  ``*-data`` key material is written to a private temporary file only for the duration of the load.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used: a missing context, cluster or server, or an unreadable file."""


@dataclass(frozen=True)
class NeedsLibrary:
    """The kubeconfig uses a feature only the Kubernetes client library implements."""

    reason: str


@dataclass(frozen=True)
class Material:
    """PEM material given either as a file path or inline (already base64-decoded)."""

    path: Path | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class Credentials:
    """How to reach one API server: its URL, the TLS material (https only) and at most one token source."""

    host: str
    ca: Material | None = None
    client_cert: Material | None = None
    client_key: Material | None = None
    verify: bool = True
    token: str | None = None  # a static token (without the "Bearer " prefix)
    token_file: Path | None = None  # a token re-read every TOKEN_REREAD_S


@dataclass
class TokenSource:
    """The ``Authorization`` header for a :class:`Credentials`: static, or re-read from its file."""

    credentials: Credentials
    clock: Any = time.monotonic
    _cached: str | None = field(default=None, init=False)
    _read_at: float = field(default=float("-inf"), init=False)

    def header(self) -> str | None:
        """The ``Authorization`` value (``Bearer ...``), or None when the credentials carry no token."""
        creds = self.credentials
        if creds.token:
            return f"Bearer {creds.token}"
        if creds.token_file is None:
            return None
        now = self.clock()
        if self._cached is None or now - self._read_at >= TOKEN_REREAD_S:
            content = creds.token_file.read_text()
            if content:  # a rotation caught mid-write keeps the previous token for one more period
                self._cached = f"Bearer {content}"
            elif self._cached is None:
                raise KubeconfigError(f"token file {creds.token_file} is empty")
            self._read_at = now
        return self._cached


def _join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"


def in_cluster(environ: Mapping[str, str] | None = None, directory: Path | None = None) -> Credentials | None:
    """The pod's service account, or None when this process does not run in a pod."""
    environ = os.environ if environ is None else environ
    directory = SERVICE_ACCOUNT_DIR if directory is None else directory
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = directory / "token", directory / "ca.crt"
    try:
        if not host or not port or not token.read_text() or not ca.read_bytes():
            return None
    except OSError:
        return None
    return Credentials(host=f"https://{_join_host_port(host, port)}", ca=Material(path=ca), token_file=token)


def _named(doc: Mapping[str, Any], section: str, name: str) -> Mapping[str, Any] | None:
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            return entry
    return None


def _material(obj: Mapping[str, Any], file_key: str, data_key: str, base: Path) -> Material | None:
    if obj.get(data_key):
        try:  # lenient like the library's decoder: characters outside the alphabet (line breaks) are skipped
            return Material(data=base64.standard_b64decode(str(obj[data_key])))
        except ValueError as exc:  # bad padding
            raise KubeconfigError(f"{data_key} is not valid base64") from exc
    if obj.get(file_key):
        return Material(path=(base / str(obj[file_key])).resolve())
    return None


def plan(doc: Mapping[str, Any], base: Path, context: str | None = None) -> Credentials | NeedsLibrary:
    """Decide how to reach the server a kubeconfig's (current or named) context points at."""
    name = context or doc.get("current-context")
    if not name:
        raise KubeconfigError("no context given and no current-context set")
    ctx_entry = _named(doc, "contexts", str(name))
    if ctx_entry is None or not isinstance(ctx_entry.get("context"), Mapping):
        raise KubeconfigError(f"context {name!r} not found")
    ctx = ctx_entry["context"]
    cluster_entry = _named(doc, "clusters", str(ctx.get("cluster", "")))
    if cluster_entry is None or not isinstance(cluster_entry.get("cluster"), Mapping):
        raise KubeconfigError(f"cluster {ctx.get('cluster')!r} of context {name!r} not found")
    cluster = cluster_entry["cluster"]
    user_entry = _named(doc, "users", str(ctx["user"])) if ctx.get("user") else None
    user: Mapping[str, Any] = {}
    if user_entry is not None and isinstance(user_entry.get("user"), Mapping):
        user = user_entry["user"]
    for key in ("exec", "auth-provider", "username", "password"):
        if key in user:
            return NeedsLibrary(f"user uses {key}")
    for key in ("tls-server-name", "proxy-url"):
        if key in cluster:
            return NeedsLibrary(f"cluster uses {key}")
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise KubeconfigError(f"cluster {ctx.get('cluster')!r} has no server")
    tls = server.startswith("https")
    token = str(user["token"]) if user.get("token") else None
    token_file = (base / str(user["tokenFile"])).resolve() if user.get("tokenFile") and token is None else None
    return Credentials(
        host=server,
        ca=_material(cluster, "certificate-authority", "certificate-authority-data", base) if tls else None,
        client_cert=_material(user, "client-certificate", "client-certificate-data", base) if tls else None,
        client_key=_material(user, "client-key", "client-key-data", base) if tls else None,
        verify=not bool(cluster.get("insecure-skip-tls-verify", False)),
        token=token,
        token_file=token_file,
    )


def default_kubeconfig(environ: Mapping[str, str] | None = None) -> Path | None:
    """The kubeconfig a client uses by default, or None when ``$KUBECONFIG`` lists several (a merge)."""
    value = (os.environ if environ is None else environ).get("KUBECONFIG", "")
    paths = [p for p in value.split(os.pathsep) if p]
    if len(paths) > 1:
        return None
    return Path(paths[0] if paths else "~/.kube/config").expanduser()


def load(path: Path, context: str | None = None) -> Credentials | NeedsLibrary:
    """Read and :func:`plan` one kubeconfig file (relative paths are relative to its directory)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path} is not valid YAML: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise KubeconfigError(f"kubeconfig {path} is not a mapping")
    return plan(doc, path.resolve().parent, context)


def _check_file(material: Material | None) -> None:
    if material is not None and material.path is not None and not material.path.is_file():
        raise KubeconfigError(f"file does not exist: {material.path}")


def ssl_context(creds: Credentials) -> ssl.SSLContext:
    """The TLS context for ``creds`` (the library's choices: the given CA only, else the system's)."""
    for material in (creds.ca, creds.client_cert, creds.client_key):
        _check_file(material)
    ca = creds.ca
    context = ssl.create_default_context(
        cafile=str(ca.path) if ca is not None and ca.path is not None else None,
        cadata=ca.data.decode() if ca is not None and ca.data is not None else None,
    )
    if creds.client_cert is not None:
        with tempfile.TemporaryDirectory(prefix="model-agent-tls-") as private:
            cert = _as_path(creds.client_cert, Path(private) / "cert.pem")
            key = _as_path(creds.client_key, Path(private) / "key.pem") if creds.client_key else None
            context.load_cert_chain(str(cert), keyfile=str(key) if key else None)
    if not creds.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _as_path(material: Material, spill: Path) -> Path:
    if material.path is not None:
        return material.path
    assert material.data is not None
    fd = os.open(spill, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(material.data)
    return spill
