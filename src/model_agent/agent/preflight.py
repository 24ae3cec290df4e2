"""The switch from OME's Go agent, judged before it is made: which models this agent would show differently, and why.

OME's agent serves some models this agent refuses on purpose (tenancy, confinement, URI grammar:
docs/ome-compatibility.md#17-deliberate-differences). An operator replacing it needs the list before the switch, not
a node full of ``Failed`` labels after it. :func:`judge` is pure: one model object and the agent's settings (the
same flags as the DaemonSet's ``model-agent run``) in, the change it would see out, each naming the setting that
keeps the model as it is. It applies the rules the reconciler and the sources apply, through the same functions
(:mod:`model_agent.model.uris`, :class:`~model_agent.local.layout.Layout`,
:func:`~model_agent.agent.tenant_local.admin_allows`, :mod:`model_agent.sources.egress`), in the same order.

What it cannot see from outside the nodes: symlinks on the hosts (paths are judged as written), whether a gated
Hugging Face repository needs the platform token a tenant no longer gets, and whether the agent's ServiceAccount
may read a BaseModel's Secret (``kubectl auth can-i get secrets -n <ns> --as=system:serviceaccount:<ns>:<sa>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from model_agent.agent.credentials import model_owner
from model_agent.agent.tenant_local import admin_allows
from model_agent.local.layout import Layout, PathRefused
from model_agent.model.resources import ModelObject
from model_agent.model.uris import InvalidStorageUri, StorageType, parse_local_uri, parse_storage_uri, storage_type
from model_agent.sources import oci
from model_agent.sources.egress import TenancyPolicy, endpoint_refusal, is_trusted

# The settings an operator changes to keep a model as OME's agent served it (flag, then the chart's value).
TENANT_LOCAL_ALLOW = "--tenant-local-allow (chart: tenancy.tenantLocalAllow)"
ALLOWED_ROOT = "--allowed-root (chart: extraAllowedRoots)"
ENDPOINT_ALLOW = "--tenant-endpoint-allow (chart: tenancy.tenantEndpointAllow), or --trusted-namespace"
TRUSTED_NAMESPACE = "--trusted-namespace (chart: tenancy.trustedNamespaces)"
THE_SPEC = "the model's spec (no setting keeps it)"


@dataclass(frozen=True)
class Change:
    """How one model would look on this agent's nodes where OME's agent served it."""

    key: str  # Kind/namespace/name
    state: str  # what this agent would show: "Failed"
    reason: str  # its reason (a ConfigMap entry's reason)
    message: str
    setting: str  # what keeps the model as it was


def judge(
    obj: ModelObject, layout: Layout, policy: TenancyPolicy, tenant_local_allow: tuple[str, ...]
) -> Change | None:
    """The change ``obj`` would see on switching to this agent with these settings; None when it would not change."""
    storage = obj.spec.storage
    uri = storage.storage_uri

    def failed(reason: str, message: str, setting: str) -> Change:
        return Change(obj.ref.key, "Failed", reason, message, setting)

    try:
        stype = storage_type(uri)
        parse_storage_uri(uri)
    except InvalidStorageUri as exc:
        return failed(exc.code, str(exc), THE_SPEC)
    raw_path = storage.path or ""
    if stype == StorageType.VENDOR:
        return None
    if stype == StorageType.LOCAL:
        raw_path = raw_path or parse_local_uri(uri).path
        tenant = bool(obj.ref.namespace) and not admin_allows(raw_path, tenant_local_allow)
        try:
            layout.check_local(raw_path, tenant=tenant)
        except PathRefused as exc:
            return failed("InvalidPath", str(exc), TENANT_LOCAL_ALLOW if tenant else THE_SPEC)
        return None
    try:
        layout.confine(raw_path)
    except PathRefused as exc:
        return failed("PathRefused", str(exc), ALLOWED_ROOT if raw_path else THE_SPEC)
    owner = model_owner(obj)
    if is_trusted(owner, policy):
        return None
    if stype == StorageType.OCI and oci.tenant_refused(uri, storage.parameters):
        return failed(
            "CredentialRefused",
            "this oci:// fetch signs with the node's own OCI identity, which a tenant's model never gets (or use "
            "parameters.s3Compat=true, a Customer Secret Key in spec.storage.key and a URI that names the namespace)",
            TRUSTED_NAMESPACE,
        )
    endpoint = str(storage.parameters.get("endpoint") or "")
    refusal = endpoint_refusal(endpoint, policy) if endpoint else None
    if refusal is not None:
        return failed("EndpointRefused", refusal, ENDPOINT_ALLOW)
    return None
