"""Hugging Face token resolution for one model (spec 9.2), with this project's stricter rules.

Order: the Secret named by ``spec.storage.key`` (data key ``parameters.secretKey`` or ``token``), then
``parameters.token`` (plain text in the CR: accepted, with a warning the caller turns into an Event), then
the process-wide ``HF_TOKEN``; none means anonymous.

Differences from OME, deliberately:
* a Secret that is named but missing (or lacks the data key) is an error (``SecretNotFound``), not a
  silent fall-back to anonymous, which hides misconfiguration until a gated download fails;
* a ClusterBaseModel's Secret is read from the agent's own namespace (``--namespace``), not a hard-coded
  ``ome``; a BaseModel's from the model's namespace;
* surrounding whitespace is stripped (a trailing newline from ``kubectl create secret --from-file`` broke
  OME's Authorization header).
The token value never reaches a log line, an Event or the ConfigMap.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass

from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import SECRETS
from model_agent.model.keys import ModelKind
from model_agent.model.resources import ModelObject
from model_agent.ops.logging import register_secret
from model_agent.sources.base import SourceError

DEFAULT_SECRET_DATA_KEY = "token"


@dataclass(frozen=True)
class ResolvedToken:
    token: str | None
    origin: str  # "secret", "parameters", "environment", "anonymous"


async def resolve_hf_token(client: KubeClient, obj: ModelObject, agent_namespace: str) -> ResolvedToken:
    storage = obj.spec.storage
    if storage.key:
        namespace = obj.metadata.namespace if obj.kind == ModelKind.BASE_MODEL else agent_namespace
        data_key = storage.parameters.get("secretKey") or DEFAULT_SECRET_DATA_KEY
        try:
            secret = await client.request("GET", SECRETS.path(namespace, storage.key))
        except ApiError as exc:
            if exc.status == 404:
                raise SourceError(
                    "SecretNotFound",
                    f"Secret {namespace}/{storage.key} named by spec.storage.key does not exist",
                ) from None
            if exc.status in (401, 403):
                raise SourceError(
                    "SecretForbidden", f"the agent may not read Secret {namespace}/{storage.key} (RBAC)"
                ) from None
            raise
        raw = (secret.get("data") or {}).get(data_key)
        if not isinstance(raw, str):
            raise SourceError("SecretNotFound", f"Secret {namespace}/{storage.key} has no data key {data_key!r}")
        try:
            token = base64.b64decode(raw, validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            raise SourceError(
                "SecretInvalid", f"Secret {namespace}/{storage.key} key {data_key!r} is not text"
            ) from None
        if not token:
            raise SourceError("SecretInvalid", f"Secret {namespace}/{storage.key} key {data_key!r} is empty")
        register_secret(token)
        return ResolvedToken(token, "secret")
    inline = storage.parameters.get("token", "").strip()
    if inline:
        register_secret(inline)
        return ResolvedToken(inline, "parameters")
    env = os.environ.get("HF_TOKEN", "").strip()
    if env:
        register_secret(env)
        return ResolvedToken(env, "environment")
    return ResolvedToken(None, "anonymous")
