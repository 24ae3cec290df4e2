"""Hugging Face token resolution for one model (docs/ome-compatibility.md#92-token-resolution), with this project's
stricter rules.

Order: the Secret named by ``spec.storage.key`` (data key ``parameters.secretKey`` or ``token``), then
``parameters.token`` (plain text in the CR: accepted, with a warning the caller turns into an Event), then
the process-wide ``HF_TOKEN`` — the platform's, so only for trusted models (ClusterBaseModels and BaseModels of
the namespaces the admin trusts, :mod:`model_agent.sources.egress`); none means anonymous.

Differences from OME, deliberately:
* a Secret that is named but missing (or lacks the data key) is an error (``SecretNotFound``), not a
  silent fall-back to anonymous, which hides misconfiguration until a gated download fails;
* a ClusterBaseModel's Secret is read from the agent's own namespace (``--namespace``), not a hard-coded
  ``ome``; a BaseModel's from the model's namespace;
* ``spec.storage.key`` must be a valid Secret name (``SecretInvalid`` otherwise): it goes into an API path;
* surrounding whitespace is stripped (a trailing newline from ``kubectl create secret --from-file`` broke
  OME's Authorization header).
The token value never reaches a log line, an Event or the ConfigMap.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from typing import Any

from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import SECRETS
from model_agent.model.keys import ModelKind
from model_agent.model.reasons import Reason
from model_agent.model.resources import ModelObject
from model_agent.ops.logging import is_credential_name, register_secret
from model_agent.sources.base import SourceError
from model_agent.sources.egress import CLUSTER_KIND, NAMESPACED_KIND, Owner, current, is_trusted

DEFAULT_SECRET_DATA_KEY = "token"
# A DNS-1123 subdomain, what the API server accepts as a Secret name.
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def model_owner(obj: ModelObject) -> Owner:
    """Who a fetch of ``obj`` is for: the tenancy rules' view of a model (see sources/egress.py)."""
    if obj.kind == ModelKind.BASE_MODEL:
        return Owner(NAMESPACED_KIND, obj.metadata.namespace or "")
    return Owner(CLUSTER_KIND)


@dataclass(frozen=True)
class ResolvedToken:
    """The token a fetch uses (None: anonymous) and where it came from, so the caller can warn about a plain one."""

    token: str | None
    origin: str  # "secret", "parameters", "environment", "anonymous"


async def _named_secret(client: KubeClient, obj: ModelObject, agent_namespace: str) -> tuple[str, dict[str, Any]]:
    """GET the Secret named by ``spec.storage.key`` under the namespace rules; (``ns/name``, the raw Secret)."""
    storage = obj.spec.storage
    assert storage.key
    namespace = obj.metadata.namespace if obj.kind == ModelKind.BASE_MODEL else agent_namespace
    if len(storage.key) > 253 or not _SECRET_NAME.fullmatch(storage.key):
        # Never put such a value in an API path ("." or ".." would address the list or the namespace).
        raise SourceError(
            Reason.SECRET_INVALID, f"spec.storage.key {storage.key[:300]!r} is not a valid Secret name", retryable=False
        )
    where = f"{namespace}/{storage.key}"
    try:
        return where, await client.request("GET", SECRETS.path(namespace, storage.key))
    except ApiError as exc:
        if exc.status == 404:
            message = f"Secret {where} named by spec.storage.key does not exist"
            raise SourceError(Reason.SECRET_NOT_FOUND, message) from None
        if exc.status in (401, 403):
            raise SourceError(Reason.SECRET_FORBIDDEN, f"the agent may not read Secret {where} (RBAC)") from None
        raise


def _decode(raw: str) -> str | None:
    try:
        return base64.b64decode(raw, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        return None


def _share(obj: ModelObject) -> str | None:
    """Whose share of the log-masking registry a model's credentials take: its namespace; None (the platform's,
    pinned) for a ClusterBaseModel."""
    return obj.ref.namespace or None


async def resolve_hf_token(client: KubeClient, obj: ModelObject, agent_namespace: str) -> ResolvedToken:
    """The Hugging Face token for ``obj``, in the module's order; a named Secret that fails is an error, not anonymous.

    Raises ``SourceError`` (``SecretNotFound``, ``SecretInvalid``, ``SecretForbidden``): never falls back silently.
    """
    storage = obj.spec.storage
    if storage.key:
        where, secret = await _named_secret(client, obj, agent_namespace)
        data_key = storage.parameters.get("secretKey") or DEFAULT_SECRET_DATA_KEY
        raw = (secret.get("data") or {}).get(data_key)
        if not isinstance(raw, str):
            raise SourceError(Reason.SECRET_NOT_FOUND, f"Secret {where} has no data key {data_key!r}")
        token = _decode(raw)
        if token is None:
            raise SourceError(Reason.SECRET_INVALID, f"Secret {where} key {data_key!r} is not text")
        if not token:
            raise SourceError(Reason.SECRET_INVALID, f"Secret {where} key {data_key!r} is empty")
        register_secret(token, _share(obj))
        register_secret(raw, _share(obj))  # the Secret's own base64 text, should an object or a response be logged
        return ResolvedToken(token, "secret")
    inline = storage.parameters.get("token", "").strip()
    if inline:
        register_secret(inline, _share(obj))
        return ResolvedToken(inline, "parameters")
    env = os.environ.get("HF_TOKEN", "").strip()
    if env and is_trusted(model_owner(obj), current()):  # the platform token never serves a tenant
        register_secret(env)  # the platform's: pinned
        return ResolvedToken(env, "environment")
    return ResolvedToken(None, "anonymous")


async def read_storage_secret(client: KubeClient, obj: ModelObject, agent_namespace: str) -> dict[str, str] | None:
    """The decoded data of the Secret named by ``spec.storage.key`` (for S3 and other keyed sources).

    None when no key is named. Same namespace rule and errors as :func:`resolve_hf_token`: a named Secret
    that is missing is ``SecretNotFound``, not a fall-back to ambient credentials. Values are stripped of
    surrounding whitespace; entries that are not text are left out. Only values under a credential-like key
    (``*secret*``, ``*token*``, ``*key*``, ``*password*``, ``*sas*``...) are registered for log masking: a
    tenant's Secret may hold anything, and a value like ``model`` registered for masking would mangle
    every later log line.
    """
    if not obj.spec.storage.key:
        return None
    _, secret = await _named_secret(client, obj, agent_namespace)
    data: dict[str, str] = {}
    for name, raw in (secret.get("data") or {}).items():
        value = _decode(raw) if isinstance(raw, str) else None
        if value is None:
            continue
        if is_credential_name(str(name)):
            register_secret(value, _share(obj))
        data[str(name)] = value
    return data
