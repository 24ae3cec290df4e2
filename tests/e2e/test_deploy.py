"""The deployment artefacts against the real API server: the Helm chart, its RBAC and its admission policy.

What this proves, in order:

1. ``helm template`` (the real helm) renders the chart with its defaults and every document server-side
   applies to kube-apiserver and can be read back;
2. the ServiceAccount's effective permissions, asked of the API server's own authorizer with
   SubjectAccessReviews, are exactly the table below (allowed and denied rows);
3. the ValidatingAdmissionPolicies, with a pod-bound ServiceAccount token (TokenRequest bound to a Pod on
   ``n1``, so it carries the ``authentication.kubernetes.io/node-name`` claim), confine what a stolen
   agent token can write to its own node: the node guard lets it write its own Node's ``models.ome.io/*``
   labels and nothing else; the ConfigMap guard its own node's ConfigMap and the shared resolve records
   (only their keys and label); the model guard only unset enrichment fields of a model's spec (never
   ``spec.storage``); the Lease guard only ``origin-*`` slot Leases, held as itself or released. A token
   without the node-name claim writes nothing. The agent's own code paths (ResolveCache, OriginSlots)
   are run with that token to show the policies accept what the agent really sends;
4. the agent itself runs with that token (so under the chart's RBAC and the policies): a ClusterBaseModel
   becomes Ready on ``n1``, its spec is enriched from the weights' config, it goes away again, and no
   request of the agent was denied.

The admission policy bindings are deleted when the module ends, so agents of other tests (admin
credentials, never matched by the policies anyway) are unaffected either way.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_agent.agent.origin_slots import OriginSlots, lease_names
from model_agent.agent.resolve_cache import ResolveCache
from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import CLUSTERBASEMODELS, CONFIGMAPS, LEASES
from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.servers.controlplane import helm_binary, repo_root
from tests.support.kube import Kube, bm, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CHART = repo_root() / "deploy" / "helm" / "model-agent"
RELEASE = "model-agent"
NAMESPACE = "ome"
FIELD_MANAGER = "model-agent-test"
NODE = "n1"
OTHER_NODE = "n2"
CBM = "ClusterBaseModel"
# A suffix unique to this module's run (the session shares one API server with other tests).
RUN = uuid.uuid4().hex[:6]
# The chart's admission policies, by the suffix of their names ("<release>-<guard>").
GUARDS = ("node-guard", "configmap-guard", "model-guard", "lease-guard")

Doc = dict[str, Any]

# kind -> (plural, namespaced): every kind the chart may render. An unknown kind fails the test, so a new
# template cannot slip through unapplied.
KINDS: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False),
    "ServiceAccount": ("serviceaccounts", True),
    "ConfigMap": ("configmaps", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "DaemonSet": ("daemonsets", True),
    "ValidatingAdmissionPolicy": ("validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("validatingadmissionpolicybindings", False),
    "NetworkPolicy": ("networkpolicies", True),
}


def object_path(doc: Doc) -> str:
    """The REST path of one rendered object (``/api/v1/...`` or ``/apis/<group>/<version>/...``)."""
    kind = doc["kind"]
    assert kind in KINDS, f"the chart rendered a {kind}, which this test does not know how to apply"
    plural, namespaced = KINDS[kind]
    api_version = doc["apiVersion"]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    name = doc["metadata"]["name"]
    if not namespaced:
        return f"{base}/{plural}/{name}"
    namespace = doc["metadata"].get("namespace")
    assert namespace == NAMESPACE, f"{kind} {name} is rendered in namespace {namespace!r}, not {NAMESPACE!r}"
    return f"{base}/namespaces/{namespace}/{plural}/{name}"


def render_chart() -> list[Doc]:
    helm = helm_binary()
    assert helm.is_file(), f"helm is not built at {helm}: run `python -m testbed build --with-helm`"
    proc = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def the_one(docs: list[Doc], kind: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, the chart rendered {len(found)}"
    return found[0]


def policies_by_guard(docs: list[Doc]) -> dict[str, str]:
    """Guard suffix -> policy name; every policy the chart renders is one of GUARDS and has one binding."""
    names = [d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    bound = [d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(names) == sorted(bound), f"policies {names} and their bindings {bound} differ"
    by_guard = {guard: f"{RELEASE}-{guard}" for guard in GUARDS}
    assert sorted(names) == sorted(by_guard.values()), f"the chart renders the policies {names}"
    return by_guard


@dataclass
class Deployment:
    docs: list[Doc]
    service_account: str
    policies: dict[str, str]

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{NAMESPACE}:{self.service_account}"

    def policy(self, guard: str) -> str:
        return self.policies[guard]

    def bindings(self) -> list[Doc]:
        return [d for d in self.docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]


@dataclass
class PodToken:
    pod: str
    token: str
    kubeconfig: Path


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
async def admin(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="module")
async def deployed(admin: KubeClient) -> AsyncIterator[Deployment]:
    """The chart rendered with the real helm and server-side applied, document by document."""
    docs = render_chart()
    for doc in docs:
        await admin.request(
            "PATCH",
            object_path(doc),
            body=doc,
            content_type="application/apply-patch+yaml",
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
    deployment = Deployment(
        docs=docs,
        service_account=the_one(docs, "ServiceAccount")["metadata"]["name"],
        policies=policies_by_guard(docs),
    )
    try:
        yield deployment
    finally:
        # Without its binding a policy does nothing; the RBAC objects and the (pod-less) DaemonSet stay.
        for binding in deployment.bindings():
            try:
                await admin.request("DELETE", object_path(binding))
            except ApiError as exc:
                if exc.status != 404:
                    raise


def write_token_kubeconfig(session_kubeconfig: Path, token: str, path: Path) -> Path:
    """A kubeconfig with the session's server and CA but the given bearer token as the user."""
    session = yaml.safe_load(session_kubeconfig.read_text())
    context_name = session["current-context"]
    context = next(c["context"] for c in session["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in session["clusters"] if c["name"] == context["cluster"])
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {"server": cluster["server"], "certificate-authority": cluster["certificate-authority"]},
            }
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "sa"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


async def request_token(admin: KubeClient, sa: str, bound_pod: Doc | None) -> str:
    spec: Doc = {"expirationSeconds": 600}
    if bound_pod is not None:
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": bound_pod["metadata"]["name"],
            "uid": bound_pod["metadata"]["uid"],
        }
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    res = await admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{sa}/token", body=body)
    token: str = res["status"]["token"]
    assert token
    return token


@pytest.fixture(scope="module")
async def pod_token(
    admin: KubeClient, deployed: Deployment, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[PodToken]:
    """A Pod of the agent's ServiceAccount bound to n1 (stays Pending: no kubelet) and a token bound to it."""
    name = f"model-agent-probe-{RUN}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": deployed.service_account,
            "containers": [{"name": "agent", "image": "registry.invalid/model-agent:probe"}],
        },
    }
    created = await admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=pod)
    try:
        token = await request_token(admin, deployed.service_account, created)
        path = write_token_kubeconfig(kubeconfig, token, tmp_path_factory.mktemp("sa-token") / "kubeconfig")
        yield PodToken(pod=name, token=token, kubeconfig=path)
    finally:
        try:
            await admin.request(
                "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", query={"gracePeriodSeconds": 0}
            )
        except ApiError as exc:
            if exc.status != 404:
                raise


async def merge_patch_node(client: KubeClient, node: str, patch: Doc, *, dry_run: bool = False) -> Doc:
    return await client.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        body=patch,
        content_type="application/merge-patch+json",
        query={"dryRun": "All"} if dry_run else None,
    )


async def denial(client: KubeClient, node: str, patch: Doc) -> ApiError | None:
    """The ApiError a node merge patch is refused with, or None when it is accepted."""
    try:
        await merge_patch_node(client, node, patch)
    except ApiError as exc:
        return exc
    return None


async def refusal(request: Awaitable[Any]) -> ApiError | None:
    """The ApiError a request is refused with, or None when it is accepted."""
    try:
        await request
    except ApiError as exc:
        return exc
    return None


def configmap(name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> Doc:
    meta: Doc = {"name": name, "namespace": NAMESPACE}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def lease(name: str, holder: str, *, renewed_s_ago: float = 0.0, rv: str | None = None, duration_s: int = 30) -> Doc:
    renewed = datetime.now(UTC) - timedelta(seconds=renewed_s_ago)
    meta: Doc = {"name": name, "namespace": NAMESPACE}
    if rv is not None:
        meta["resourceVersion"] = rv
    stamp = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": stamp,
            "renewTime": stamp,
        },
    }


DRY_RUN = {"dryRun": "All"}


async def wait_policies_effective(admin: KubeClient, agent: KubeClient, deployed: Deployment) -> None:
    """Policies and bindings are picked up asynchronously: retry, for each policy, a dry run it must deny.

    Each probe is a request RBAC allows and only that policy refuses, sent as a dry run so an attempt that
    is still let through changes nothing. The model guard needs a model to update: a throw-away
    ClusterBaseModel, deleted before this returns (no agent runs meanwhile).
    """
    probe_model = f"vap-wait-{RUN}"
    await Kube(admin).apply(cbm(probe_model, "hf://vap-wait/model"))
    probes: dict[str, Callable[[], Awaitable[Any]]] = {
        "node-guard": lambda: merge_patch_node(
            agent,
            OTHER_NODE,
            {"metadata": {"labels": {f"models.ome.io/clusterbasemodel.vap-wait-{RUN}": "Ready"}}},
            dry_run=True,
        ),
        "configmap-guard": lambda: agent.request(
            "POST", CONFIGMAPS.path(NAMESPACE), body=configmap(f"{OTHER_NODE}-vap-wait-{RUN}", {}), query=DRY_RUN
        ),
        "model-guard": lambda: agent.request(
            "PATCH",
            CLUSTERBASEMODELS.path(None, probe_model),
            body={"spec": {"storage": {"storageUri": "hf://elsewhere/model"}}},
            content_type="application/merge-patch+json",
            query=DRY_RUN,
        ),
        "lease-guard": lambda: agent.request(
            "POST", LEASES.path(NAMESPACE), body=lease(f"foreign-vap-wait-{RUN}", NODE), query=DRY_RUN
        ),
    }
    assert sorted(probes) == sorted(GUARDS)
    try:
        started = time.monotonic()
        for guard, probe in probes.items():
            policy = deployed.policy(guard)

            async def denied(probe: Callable[[], Awaitable[Any]] = probe, policy: str = policy) -> bool:
                exc = await refusal(probe())
                return exc is not None and exc.status == 403 and policy in exc.message

            await eventually(denied, timeout=30, what=f"ValidatingAdmissionPolicy {policy} in effect", interval=0.2)
        print(
            f"admission policies {sorted(deployed.policies.values())} effective after {time.monotonic() - started:.1f}s"
        )
    finally:
        await Kube(admin).delete_model(CBM, probe_model)


# ------------------------------------------------------------------------------------------- 1. the chart


async def test_chart_renders_and_every_document_applies(admin: KubeClient, deployed: Deployment) -> None:
    kinds = sorted({d["kind"] for d in deployed.docs})
    for required in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet"):
        assert required in kinds, f"the chart's default rendering has no {required}"
    assert "ValidatingAdmissionPolicy" in kinds and "ValidatingAdmissionPolicyBinding" in kinds
    for doc in deployed.docs:
        path = object_path(doc)
        live = await admin.request("GET", path)
        assert live["kind"] == doc["kind"]
        assert live["metadata"]["name"] == doc["metadata"]["name"]
        managers = {m.get("manager") for m in live["metadata"].get("managedFields") or []}
        assert FIELD_MANAGER in managers, f"{path} not applied by {FIELD_MANAGER}: {managers}"
        print(f"applied {doc['kind']:<34} {path}")
    assert deployed.service_account == RELEASE
    live_bindings = [await admin.request("GET", object_path(doc)) for doc in deployed.bindings()]
    assert sorted(b["spec"]["policyName"] for b in live_bindings) == sorted(deployed.policies.values())
    for binding in live_bindings:
        assert binding["spec"]["validationActions"] == ["Deny"], binding["metadata"]["name"]


# ------------------------------------------------------------------------------------------------- 2. RBAC

# (verb, group, resource, subresource, namespace, name) -> allowed?   "" = none / all namespaces.
RBAC_TABLE: list[tuple[str, str, str, str, str, str, bool]] = [
    # models: caches (all namespaces), confirmation reads, spec enrichment; never update/delete/create
    ("list", "ome.io", "basemodels", "", "", "", True),
    ("watch", "ome.io", "basemodels", "", "", "", True),
    ("get", "ome.io", "basemodels", "", "team-x", "m", True),
    ("patch", "ome.io", "basemodels", "", "team-x", "m", True),
    ("list", "ome.io", "clusterbasemodels", "", "", "", True),
    ("watch", "ome.io", "clusterbasemodels", "", "", "", True),
    ("get", "ome.io", "clusterbasemodels", "", "", "m", True),
    ("patch", "ome.io", "clusterbasemodels", "", "", "m", True),
    ("update", "ome.io", "basemodels", "", "team-x", "m", False),
    ("delete", "ome.io", "basemodels", "", "team-x", "m", False),
    ("update", "ome.io", "clusterbasemodels", "", "", "m", False),
    ("delete", "ome.io", "clusterbasemodels", "", "", "m", False),
    ("create", "ome.io", "clusterbasemodels", "", "", "", False),
    ("patch", "ome.io", "clusterbasemodels", "status", "", "m", False),
    # nodes: read and patch (the admission policy narrows the patch); nothing else
    ("get", "", "nodes", "", "", NODE, True),
    ("list", "", "nodes", "", "", "", True),
    ("watch", "", "nodes", "", "", "", True),
    ("patch", "", "nodes", "", "", NODE, True),
    ("update", "", "nodes", "", "", NODE, False),
    ("delete", "", "nodes", "", "", NODE, False),
    ("create", "", "nodes", "", "", "", False),
    ("patch", "", "nodes", "status", "", NODE, False),
    ("update", "", "nodes", "status", "", NODE, False),
    # configmaps: own namespace only, never update/delete
    ("get", "", "configmaps", "", NAMESPACE, NODE, True),
    ("list", "", "configmaps", "", NAMESPACE, "", True),
    ("watch", "", "configmaps", "", NAMESPACE, "", True),
    ("create", "", "configmaps", "", NAMESPACE, "", True),
    ("patch", "", "configmaps", "", NAMESPACE, NODE, True),
    ("update", "", "configmaps", "", NAMESPACE, NODE, False),
    ("delete", "", "configmaps", "", NAMESPACE, NODE, False),
    ("deletecollection", "", "configmaps", "", NAMESPACE, "", False),
    ("list", "", "configmaps", "", "", "", False),
    ("get", "", "configmaps", "", "default", "x", False),
    ("list", "", "configmaps", "", "default", "", False),
    ("create", "", "configmaps", "", "default", "", False),
    ("patch", "", "configmaps", "", "default", "x", False),
    ("get", "", "configmaps", "", "kube-system", "x", False),
    ("watch", "", "configmaps", "", "kube-system", "", False),
    ("patch", "", "configmaps", "", "kube-system", "x", False),
    # secrets: get by name in the own namespace; no listing, nothing elsewhere (model namespaces unbound)
    ("get", "", "secrets", "", NAMESPACE, "hf-token", True),
    ("list", "", "secrets", "", NAMESPACE, "", False),
    ("watch", "", "secrets", "", NAMESPACE, "", False),
    ("create", "", "secrets", "", NAMESPACE, "", False),
    ("get", "", "secrets", "", "kube-system", "hf-token", False),
    ("get", "", "secrets", "", "team-x", "hf-token", False),
    ("list", "", "secrets", "", "", "", False),
    # events: create and patch (aggregation) wherever the model lives
    ("create", "", "events", "", "default", "", True),
    ("patch", "", "events", "", "default", "e", True),
    ("create", "", "events", "", "team-x", "", True),
    ("delete", "", "events", "", "default", "e", False),
    ("create", "events.k8s.io", "events", "", "default", "", False),
    # leases: own namespace only, get/create/update (names, holders: the lease guard)
    ("get", "coordination.k8s.io", "leases", "", NAMESPACE, "l", True),
    ("create", "coordination.k8s.io", "leases", "", NAMESPACE, "", True),
    ("update", "coordination.k8s.io", "leases", "", NAMESPACE, "l", True),
    ("delete", "coordination.k8s.io", "leases", "", NAMESPACE, "l", False),
    ("patch", "coordination.k8s.io", "leases", "", NAMESPACE, "l", False),
    ("list", "coordination.k8s.io", "leases", "", NAMESPACE, "", False),
    ("watch", "coordination.k8s.io", "leases", "", NAMESPACE, "", False),
    ("get", "coordination.k8s.io", "leases", "", "kube-system", "l", False),
    ("create", "coordination.k8s.io", "leases", "", "kube-system", "", False),
    ("update", "coordination.k8s.io", "leases", "", "kube-system", "l", False),
    # everything else
    ("create", "", "pods", "", NAMESPACE, "", False),
    ("list", "", "pods", "", "", "", False),
    ("create", "", "serviceaccounts", "token", NAMESPACE, RELEASE, False),
    ("patch", "apps", "daemonsets", "", NAMESPACE, RELEASE, False),
    ("create", "rbac.authorization.k8s.io", "rolebindings", "", NAMESPACE, "", False),
    ("patch", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", "", "x", False),
    ("*", "*", "*", "", "", "", False),
    ("*", "*", "*", "", NAMESPACE, "", False),
]


async def access_review(admin: KubeClient, user: str, row: tuple[str, str, str, str, str, str, bool]) -> bool:
    verb, group, resource, subresource, namespace, name, _ = row
    attrs = {"verb": verb, "group": group, "resource": resource}
    for key, value in (("subresource", subresource), ("namespace", namespace), ("name", name)):
        if value:
            attrs[key] = value
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            "resourceAttributes": attrs,
        },
    }
    res = await admin.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=body)
    return bool(res.get("status", {}).get("allowed"))


async def test_rbac_allows_exactly_the_table(admin: KubeClient, deployed: Deployment) -> None:
    user = deployed.username
    results = await asyncio.gather(*(access_review(admin, user, row) for row in RBAC_TABLE))
    header = f"{'verb':<17} {'group':<29} {'resource':<35} {'namespace':<12} {'name':<12} {'expect':<6} {'got':<6}"
    lines = [f"SubjectAccessReviews for {user}:", header, "-" * len(header)]
    wrong = []
    for row, allowed in zip(RBAC_TABLE, results, strict=True):
        verb, group, resource, sub, namespace, name, expected = row
        res = f"{resource}/{sub}" if sub else resource
        mark = "" if allowed == expected else "  <-- MISMATCH"
        lines.append(
            f"{verb:<17} {group or '(core)':<29} {res:<35} {namespace or '*':<12} {name or '*':<12} "
            f"{'allow' if expected else 'deny':<6} {'allow' if allowed else 'deny':<6}{mark}"
        )
        if allowed != expected:
            wrong.append(row)
    print("\n".join(lines))
    assert not wrong, f"{len(wrong)} RBAC rows differ from the table: {wrong}"


# --------------------------------------------------------------------------------------- 3. the policy


async def test_admission_policy_confines_the_agent_to_its_own_nodes_model_labels(
    admin: KubeClient, deployed: Deployment, pod_token: PodToken, kubeconfig: Path, tmp_path: Path
) -> None:
    label = f"models.ome.io/clusterbasemodel.vap-test-{RUN}"
    admin_kube = Kube(admin)
    agent = await KubeClient.connect(pod_token.kubeconfig)
    try:
        # The token is the agent's ServiceAccount, and carries the node its pod is bound to.
        review = await agent.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        info = review["status"]["userInfo"]
        assert info["username"] == deployed.username
        assert info.get("extra", {}).get("authentication.kubernetes.io/node-name") == [NODE], info
        claim = info["extra"]["authentication.kubernetes.io/node-name"]
        print(f"pod-bound token: user {info['username']}, node-name claim {claim}")

        await wait_policies_effective(admin, agent, deployed)
        policy = deployed.policy("node-guard")

        # Its own Node, a model label with an agent value: accepted.
        assert await denial(agent, NODE, {"metadata": {"labels": {label: "Ready"}}}) is None
        assert (await admin_kube.node_labels(NODE)).get(label) == "Ready"

        # Another Node: refused by the policy (RBAC alone would allow it).
        exc = await denial(agent, OTHER_NODE, {"metadata": {"labels": {label: "Ready"}}})
        assert exc is not None and exc.status == 403, exc
        assert policy in exc.message and f"may not modify Node {OTHER_NODE}" in exc.message, exc.message
        assert label not in await admin_kube.node_labels(OTHER_NODE)
        print(f"n2 patch refused: {exc.message}")

        # A label outside the prefix on its own Node: refused, and named.
        exc = await denial(agent, NODE, {"metadata": {"labels": {"team": "x"}}})
        assert exc is not None and exc.status == 403, exc
        assert policy in exc.message and "team" in exc.message, exc.message
        print(f"non-model label refused: {exc.message}")

        # A model label with a value the agent never writes: refused.
        exc = await denial(agent, NODE, {"metadata": {"labels": {label: "Pwned"}}})
        assert exc is not None and exc.status == 403 and "Ready, Updating or Failed" in exc.message, exc

        # Annotations and the spec: refused.
        exc = await denial(agent, NODE, {"metadata": {"annotations": {"x": "y"}}})
        assert exc is not None and exc.status == 403 and "annotations" in exc.message, exc
        # ... but the peer address (model_agent.peers), its one annotation, on its own Node: accepted.
        assert (
            await denial(agent, NODE, {"metadata": {"annotations": {"models.ome.io/peer-address": "10.0.0.1:8090"}}})
            is None
        )
        exc = await denial(
            agent, OTHER_NODE, {"metadata": {"annotations": {"models.ome.io/peer-address": "10.0.0.1:1"}}}
        )
        assert exc is not None and exc.status == 403, exc
        exc = await denial(agent, NODE, {"spec": {"unschedulable": True}})
        assert exc is not None and exc.status == 403 and "spec" in exc.message, exc

        # The status subresource: refused (by RBAC already).
        try:
            await agent.request(
                "PATCH",
                f"/api/v1/nodes/{NODE}/status",
                body={"metadata": {"labels": {label: "Failed"}}},
                content_type="application/merge-patch+json",
            )
        except ApiError as err:
            assert err.status == 403, err
        else:
            raise AssertionError("patch of nodes/status was accepted")

        # Removing its model label from its own Node: accepted.
        assert await denial(agent, NODE, {"metadata": {"labels": {label: None}}}) is None
        assert label not in await admin_kube.node_labels(NODE)
        assert (await admin_kube.node_labels(NODE)).get("team") is None

        # A token of the same ServiceAccount that is not bound to a pod (no node-name claim): refused even
        # on n1, so a token minted outside a pod cannot relabel any Node.
        unbound = await request_token(admin, deployed.service_account, None)
        unbound_cfg = write_token_kubeconfig(kubeconfig, unbound, tmp_path / "unbound-kubeconfig")
        async with await KubeClient.connect(unbound_cfg) as loose:
            exc = await denial(loose, NODE, {"metadata": {"labels": {label: "Ready"}}})
        assert exc is not None and exc.status == 403 and "node-name" in exc.message, exc
        print(f"unbound token refused: {exc.message}")
    finally:
        await agent.close()
        await admin_kube.label_node(NODE, {label: None, "team": None})
        await admin_kube.label_node(OTHER_NODE, {label: None})


async def merge_patch(client: KubeClient, path: str, patch: Doc) -> Doc:
    return await client.request("PATCH", path, body=patch, content_type="application/merge-patch+json")


async def write_own_configmap(client: KubeClient, data: dict[str, str]) -> None:
    """What the agent does with its node's ConfigMap: a merge patch of keys, or a create when it is missing."""
    try:
        await merge_patch(client, CONFIGMAPS.path(NAMESPACE, NODE), {"data": data})
    except ApiError as exc:
        if exc.status != 404:
            raise
        await client.request("POST", CONFIGMAPS.path(NAMESPACE), body=configmap(NODE, data))


def refused_by(exc: ApiError | None, policy: str, *fragments: str) -> ApiError:
    """Assert a 403 from ``policy`` whose message holds every fragment; return it for printing."""
    assert exc is not None, f"accepted, but {policy} should have refused it"
    assert exc.status == 403, exc
    assert policy in exc.message, exc.message
    for fragment in fragments:
        assert fragment in exc.message, (fragment, exc.message)
    return exc


async def test_configmap_policy_confines_writes_to_its_own_node_and_the_resolve_records(
    admin: KubeClient, deployed: Deployment, pod_token: PodToken, kubeconfig: Path, tmp_path: Path
) -> None:
    policy = deployed.policy("configmap-guard")
    key = f"vap-test-{RUN}"
    uri = f"hf://vap-org/model-{RUN}"
    record = ResolveCache.name(uri)
    foreign_record = ResolveCache.name(uri + "-foreign")
    # Another node's ConfigMap, as the OME controller would read it (created by an administrator here).
    exists = await refusal(admin.request("POST", CONFIGMAPS.path(NAMESPACE), body=configmap(OTHER_NODE, {})))
    assert exists is None or exists.status == 409, exists
    agent = await KubeClient.connect(pod_token.kubeconfig)
    try:
        await wait_policies_effective(admin, agent, deployed)

        # Its own node's ConfigMap: accepted (create or merge patch, whichever the agent's first write is).
        assert await refusal(write_own_configmap(agent, {key: "{}"})) is None
        own = await admin.request("GET", CONFIGMAPS.path(NAMESPACE, NODE))
        assert own["data"][key] == "{}"

        # Another node's ConfigMap (update), and a new ConfigMap of any other name (create): refused.
        exc = refused_by(
            await refusal(merge_patch(agent, CONFIGMAPS.path(NAMESPACE, OTHER_NODE), {"data": {key: "{}"}})),
            policy,
            f"not {OTHER_NODE}",
        )
        print(f"another node's ConfigMap refused: {exc.message}")
        other = await admin.request("GET", CONFIGMAPS.path(NAMESPACE, OTHER_NODE))
        assert key not in (other.get("data") or {})
        refused_by(
            await refusal(
                agent.request("POST", CONFIGMAPS.path(NAMESPACE), body=configmap(f"model-agent-config-{RUN}", {}))
            ),
            policy,
            f"model-agent-config-{RUN}",
        )

        # The agent's own resolve-cache code: the first put creates the record, the second merge-patches it.
        cache = ResolveCache(agent, NAMESPACE)
        files: list[dict[str, Any]] = [{"path": "config.json", "size": 2, "sha256": None, "git_sha1": "c" * 40}]
        await cache.put(uri, "a" * 40, files)
        assert (await admin.request("GET", CONFIGMAPS.path(NAMESPACE, record)))["data"]["commit"] == "a" * 40
        await cache.put(uri, "b" * 40, files)
        written = await admin.request("GET", CONFIGMAPS.path(NAMESPACE, record))
        assert written["data"]["commit"] == "b" * 40, "the resolve record's merge patch was refused"
        assert sorted(written["data"]) == ["at", "commit", "files", "uri"]
        assert await cache.get(uri, "b" * 40) == ("b" * 40, files)

        # A resolve record with a key or a label the agent never writes: refused.
        refused_by(
            await refusal(merge_patch(agent, CONFIGMAPS.path(NAMESPACE, record), {"data": {"script": "x"}})),
            policy,
            "script",
        )
        refused_by(
            await refusal(
                merge_patch(agent, CONFIGMAPS.path(NAMESPACE, record), {"metadata": {"labels": {"team": "x"}}})
            ),
            policy,
            "app.kubernetes.io/managed-by=model-agent",
        )
        refused_by(
            await refusal(
                agent.request(
                    "POST", CONFIGMAPS.path(NAMESPACE), body=configmap(foreign_record, {"uri": uri}, labels={})
                )
            ),
            policy,
            "label",
        )
        refused_by(
            await refusal(merge_patch(agent, CONFIGMAPS.path(NAMESPACE, record), {"immutable": True})),
            policy,
            "immutable",
        )

        # A token of the same ServiceAccount without the node-name claim: refused even for n1's ConfigMap.
        unbound = await request_token(admin, deployed.service_account, None)
        unbound_cfg = write_token_kubeconfig(kubeconfig, unbound, tmp_path / "unbound-kubeconfig")
        async with await KubeClient.connect(unbound_cfg) as loose:
            exc = refused_by(await refusal(write_own_configmap(loose, {key: "[]"})), policy, "node-name")
        print(f"unbound token refused: {exc.message}")
    finally:
        await agent.close()
        await merge_patch(admin, CONFIGMAPS.path(NAMESPACE, NODE), {"data": {key: None}})
        for name in (record, foreign_record):
            try:
                await admin.request("DELETE", CONFIGMAPS.path(NAMESPACE, name))
            except ApiError as exc:
                if exc.status != 404:
                    raise


async def test_model_policy_lets_the_agent_fill_only_unset_enrichment_fields(
    admin: KubeClient, deployed: Deployment, pod_token: PodToken, kubeconfig: Path, tmp_path: Path
) -> None:
    policy = deployed.policy("model-guard")
    admin_kube = Kube(admin)
    name = f"vap-model-{RUN}"
    uri = "hf://vap-org/victim"
    body = cbm(name, uri)
    # Set, empty string, empty list, empty object, absent: each kind of "unset" the agent may fill.
    body["spec"].update(
        {"modelType": "llama", "modelArchitecture": "", "modelCapabilities": [], "modelConfiguration": {}}
    )
    namespaced = bm("default", name, uri)
    agent = await KubeClient.connect(pod_token.kubeconfig)
    try:
        created = await admin_kube.apply(body)
        await admin_kube.apply(namespaced)
        spec = created["spec"]
        # The empty values are stored as sent, so the fills below go through the policy's size() checks.
        assert spec["modelArchitecture"] == "" and spec["modelCapabilities"] == [] and spec["modelConfiguration"] == {}
        await wait_policies_effective(admin, agent, deployed)
        path = CLUSTERBASEMODELS.path(None, name)

        # Swapping the weights' source (the fleet-wide poisoning a stolen token could do): refused, on both kinds.
        exc = refused_by(
            await refusal(merge_patch(agent, path, {"spec": {"storage": {"storageUri": "hf://attacker/poison"}}})),
            policy,
            "spec.storage",
        )
        print(f"storageUri patch refused: {exc.message}")
        refused_by(
            await refusal(
                merge_patch(
                    agent,
                    f"/apis/ome.io/v1beta1/namespaces/default/basemodels/{name}",
                    {"spec": {"storage": {"storageUri": "hf://attacker/poison"}}},
                )
            ),
            policy,
            "spec.storage",
        )
        # Another spec field, a set enrichment field, labels: refused.
        refused_by(await refusal(merge_patch(agent, path, {"spec": {"disabled": True}})), policy, "spec.disabled")
        exc = refused_by(
            await refusal(merge_patch(agent, path, {"spec": {"modelType": "mistral"}})), policy, "spec.modelType"
        )
        print(f"overwrite refused: {exc.message}")
        refused_by(await refusal(merge_patch(agent, path, {"metadata": {"labels": {"team": "x"}}})), policy, "labels")
        live = await admin_kube.get_model(CBM, name)
        assert live["spec"]["storage"]["storageUri"] == uri and live["spec"]["modelType"] == "llama"

        # The agent's enrichment patch (reconciler._enrich_spec's shape: only unset keys, with the uid):
        # accepted, filling the empty string, list and object and the absent fields.
        fill = {
            "modelArchitecture": "LlamaForCausalLM",
            "modelCapabilities": ["TEXT_GENERATION"],
            "modelConfiguration": {"architecture": "LlamaForCausalLM"},
            "modelParameterSize": "1.24B",
            "modelFramework": {"name": "transformers"},
            "modelFormat": {"name": "safetensors"},
            "quantization": "fp8",
        }
        patch = {"metadata": {"uid": created["metadata"]["uid"]}, "spec": fill}
        assert await refusal(merge_patch(agent, path, patch)) is None
        live = await admin_kube.get_model(CBM, name)
        for field, value in fill.items():
            if isinstance(value, dict):
                assert value.items() <= live["spec"][field].items(), (field, live["spec"][field])
            else:
                assert live["spec"][field] == value, field
        # Once filled, the same fields are set: filling them again with something else is refused.
        refused_by(
            await refusal(merge_patch(agent, path, {"spec": {"modelArchitecture": "MistralForCausalLM"}})),
            policy,
            "spec.modelArchitecture",
        )
        refused_by(
            await refusal(merge_patch(agent, path, {"spec": {"modelCapabilities": ["EMBEDDING"]}})),
            policy,
            "spec.modelCapabilities",
        )

        # A token without the node-name claim: refused even for an enrichment field.
        unbound = await request_token(admin, deployed.service_account, None)
        unbound_cfg = write_token_kubeconfig(kubeconfig, unbound, tmp_path / "unbound-kubeconfig")
        async with await KubeClient.connect(unbound_cfg) as loose:
            refused_by(
                await refusal(
                    merge_patch(
                        loose,
                        f"/apis/ome.io/v1beta1/namespaces/default/basemodels/{name}",
                        {"spec": {"modelType": "llama"}},
                    )
                ),
                policy,
                "node-name",
            )
    finally:
        await agent.close()
        await admin_kube.delete_model(CBM, name)
        await admin_kube.delete_model("BaseModel", name, "default")


async def test_lease_policy_allows_only_origin_slots_held_as_itself(
    admin: KubeClient, deployed: Deployment, pod_token: PodToken, kubeconfig: Path, tmp_path: Path
) -> None:
    policy = deployed.policy("lease-guard")
    foreign = f"ome-controller-leader-{RUN}"
    slots = lease_names(f"hf://vap-org/slots-{RUN}", 3)
    taken_over = lease_names(f"hf://vap-org/taken-over-{RUN}", 1)[0]
    created: list[str] = []

    async def admin_create(doc: Doc) -> None:
        await admin.request("POST", LEASES.path(NAMESPACE), body=doc)
        created.append(doc["metadata"]["name"])

    async def put_as(client: KubeClient, name: str, holder: str) -> Doc:
        current = await client.request("GET", LEASES.path(NAMESPACE, name))
        rv = str(current["metadata"]["resourceVersion"])
        return await client.request("PUT", LEASES.path(NAMESPACE, name), body=lease(name, holder, rv=rv))

    agent = await KubeClient.connect(pod_token.kubeconfig)
    try:
        # A controller's leader-election Lease in the agent's namespace.
        await admin_create(lease(foreign, "ome-controller-7f9c"))
        await wait_policies_effective(admin, agent, deployed)

        # Taking the foreign Lease over, even as itself: refused (RBAC alone allows updating every Lease).
        exc = refused_by(await refusal(put_as(agent, foreign, NODE)), policy, f"not {foreign}")
        print(f"foreign Lease refused: {exc.message}")
        live = await admin.request("GET", LEASES.path(NAMESPACE, foreign))
        assert live["spec"]["holderIdentity"] == "ome-controller-7f9c"

        # An origin slot created as itself: accepted; renewed with its acquireTime kept: accepted; renewed with a new
        # acquireTime (a stolen token resetting the hold bound other nodes time): refused; released: accepted.
        created.append(slots[0])
        assert await refusal(agent.request("POST", LEASES.path(NAMESPACE), body=lease(slots[0], NODE))) is None
        held = await agent.request("GET", LEASES.path(NAMESPACE, slots[0]))
        held["spec"]["renewTime"] = lease(slots[0], NODE)["spec"]["renewTime"]
        held = await agent.request("PUT", LEASES.path(NAMESPACE, slots[0]), body=held)
        exc = refused_by(await refusal(put_as(agent, slots[0], NODE)), policy, "acquireTime")
        print(f"moving the acquireTime refused: {exc.message}")
        assert await refusal(put_as(agent, slots[0], "")) is None
        # An origin slot created or taken as another node: refused.
        exc = refused_by(
            await refusal(agent.request("POST", LEASES.path(NAMESPACE), body=lease(slots[1], OTHER_NODE))),
            policy,
            f"not as {OTHER_NODE}",
        )
        print(f"holding as another node refused: {exc.message}")
        await admin_create(lease(slots[2], OTHER_NODE))
        refused_by(await refusal(put_as(agent, slots[2], OTHER_NODE)), policy, f"not as {OTHER_NODE}")
        # Releasing a slot another node holds: refused.
        refused_by(await refusal(put_as(agent, slots[2], "")), policy, f"held by {OTHER_NODE}")
        assert (await admin.request("GET", LEASES.path(NAMESPACE, slots[2])))["spec"]["holderIdentity"] == OTHER_NODE

        # The agent's own slot code: it takes over a slot whose holder stopped renewing (its record unchanged for the
        # Lease's duration, as this process observes it: 2 s here), and releases it.
        await admin_create(lease(taken_over, OTHER_NODE, renewed_s_ago=3600, duration_s=2))
        origin = OriginSlots(agent, NAMESPACE, NODE, 1, poll_s=0.2)

        async def hold_once() -> str:
            async with origin.hold(f"hf://vap-org/taken-over-{RUN}") as name:
                held = await admin.request("GET", LEASES.path(NAMESPACE, name))
                assert held["spec"]["holderIdentity"] == NODE
                return name

        assert await asyncio.wait_for(hold_once(), timeout=30) == taken_over
        released = await admin.request("GET", LEASES.path(NAMESPACE, taken_over))
        assert released["spec"].get("holderIdentity", "") == "", released["spec"]

        # A token without the node-name claim: refused even for an origin slot as "itself".
        unbound = await request_token(admin, deployed.service_account, None)
        unbound_cfg = write_token_kubeconfig(kubeconfig, unbound, tmp_path / "unbound-kubeconfig")
        async with await KubeClient.connect(unbound_cfg) as loose:
            refused_by(
                await refusal(loose.request("POST", LEASES.path(NAMESPACE), body=lease(slots[1], NODE))),
                policy,
                "node-name",
            )
    finally:
        await agent.close()
        for name in created:
            try:
                await admin.request("DELETE", LEASES.path(NAMESPACE, name))
            except ApiError as exc:
                if exc.status != 404:
                    raise


# ----------------------------------------------------------------------------------------- 4. the agent


async def test_agent_runs_under_the_chart_rbac_and_policy(
    admin: KubeClient, deployed: Deployment, pod_token: PodToken, tmp_path: Path
) -> None:
    admin_kube = Kube(admin)
    name = f"deploy-{RUN}"
    key = node_label_key(CBM, "", name)
    entry_key = configmap_key(CBM, "", name)
    weights = tmp_path / "local-weights" / name
    weights.mkdir(parents=True)
    (weights / "config.json").write_bytes(tiny_llama(0)["config.json"])

    async with await KubeClient.connect(pod_token.kubeconfig) as probe:
        await wait_policies_effective(admin, probe, deployed)

    agent = AgentProcess(
        kubeconfig=pod_token.kubeconfig,
        node=NODE,
        models_root=tmp_path / "models",
        log_path=tmp_path / "agent.log",
        args=("--namespace", NAMESPACE, "--resync-interval", "30", "--delete-settle", "0.5"),
    )
    agent.start()
    try:
        await asyncio.to_thread(agent.wait_ready)
        await admin_kube.apply(cbm(name, f"local://{weights}", str(weights)))

        async def ready() -> bool:
            label = (await admin_kube.node_labels(NODE)).get(key)
            entry = await admin_kube.entry(NODE, entry_key, NAMESPACE)
            return label == "Ready" and (entry or {}).get("status") == "Ready"

        started = time.monotonic()
        try:
            await eventually(ready, timeout=60, what=f"{key}=Ready on {NODE} and its entry in {NAMESPACE}/{NODE}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nagent log:\n{agent.tail()}") from None
        print(f"model {name} Ready on {NODE} under the chart's RBAC in {time.monotonic() - started:.1f}s")

        # The agent's spec enrichment (a merge patch of the unset fields) passes the model guard.
        async def enriched() -> bool:
            spec = (await admin_kube.get_model(CBM, name))["spec"]
            return bool(spec.get("modelType") == "llama" and spec.get("modelArchitecture") == "LlamaForCausalLM")

        try:
            await eventually(enriched, timeout=60, what=f"{CBM} {name} spec enriched by the agent")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nagent log:\n{agent.tail()}") from None

        await admin_kube.delete_model(CBM, name)

        async def gone() -> bool:
            label = (await admin_kube.node_labels(NODE)).get(key)
            entry = await admin_kube.entry(NODE, entry_key, NAMESPACE)
            return label is None and entry is None

        try:
            await eventually(gone, timeout=60, what=f"{key} and its entry removed from {NODE}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nagent log:\n{agent.tail()}") from None

        samples = agent.metrics()
        denied = {k: v for k, v in samples.items() if k.startswith("model_agent_rbac_denied_total") and v > 0}
        assert not denied, f"the agent had requests denied: {denied}\nagent log:\n{agent.tail()}"
        api_calls = {k: v for k, v in samples.items() if k.startswith("model_agent_api_request_duration_seconds_count")}
        assert api_calls, "the agent reported no API requests at all"
        assert all('code="403"' not in k and 'code="401"' not in k for k in api_calls), api_calls
    finally:
        if agent.alive():
            agent.stop()
        await admin_kube.delete_model(CBM, name)
        await admin_kube.label_node(NODE, {key: None})
