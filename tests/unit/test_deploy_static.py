"""Static checks of deploy/: plain manifests, Helm chart defaults and the Grafana dashboard, without helm.

What must hold for the agent to work (and to stay least-privilege) whatever else changes:
* every YAML under deploy/manifests parses, and the kustomization lists exactly those files;
* the DaemonSet mounts the hostPath at the same path it passes as --models-root-dir, takes NODE_NAME from
  spec.nodeName, runs hardened, and probes /livez and /readyz;
* nothing bound cluster-wide grants Secrets, no rule uses a wildcard, the Role is namespaced;
* every admission policy matches exactly the agent's ServiceAccount, is bound with Deny, fails closed and
  requires the pod-bound token's node-name claim; the ConfigMap, model and Lease guards allow exactly the
  names, keys and spec fields the agent's own code writes (derived from that code, not restated);
* the manifests agree with the chart's values.yaml defaults (and with ``helm template`` when helm is on
  PATH);
* every ``model_agent_*`` series the dashboard queries is exposed by :class:`model_agent.ops.metrics.Metrics`.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from model_agent.agent.origin_slots import lease_names
from model_agent.agent.reconciler import _metadata_record
from model_agent.agent.resolve_cache import ResolveCache
from model_agent.kube.client import ApiError, KubeClient
from model_agent.local.metadata_files import parse_model_dir
from model_agent.ops.metrics import Metrics
from testbed.servers.controlplane import helm_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = DEPLOY / "manifests"
CHART = DEPLOY / "helm" / "model-agent"
DASHBOARD = DEPLOY / "grafana" / "model-agent-dashboard.json"
NAMESPACE = "ome"
MODEL_LABEL_PREFIX = "models.ome.io/"

Doc = dict[str, Any]


def _manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")


def _docs() -> list[Doc]:
    docs: list[Doc] = []
    for path in _manifest_files():
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d is not None)
    return docs


def _one(kind: str, name: str | None = None) -> Doc:
    found = [d for d in _docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _container() -> Doc:
    containers = _one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return cast(Doc, containers[0])


def _arg(container: Doc, flag: str) -> list[str]:
    """Values of ``--flag=value`` and ``--flag value`` in the container's args."""
    args = [str(a) for a in container.get("args", [])]
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
    values += [args[i + 1] for i, a in enumerate(args[:-1]) if a == f"--{flag}"]
    return values


def _service_account() -> tuple[str, str]:
    sa = _one("ServiceAccount")
    return sa["metadata"]["namespace"], sa["metadata"]["name"]


# ----------------------------------------------------------------------------------------------- manifests


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_every_manifest_parses_into_named_objects(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), path.name
        assert doc["metadata"]["name"], path.name


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in _manifest_files())
    top = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert "manifests" in top
    crds = [r for r in top if r.startswith("crds/")]
    assert sorted(crds) == sorted(f"crds/{p.name}" for p in (DEPLOY / "crds").glob("*.yaml"))


def test_namespaced_objects_live_in_ome() -> None:
    for doc in _docs():
        if doc["kind"] in {"ServiceAccount", "Role", "RoleBinding", "DaemonSet"}:
            assert doc["metadata"].get("namespace") == NAMESPACE, (doc["kind"], doc["metadata"]["name"])
    assert _arg(_container(), "namespace") == [NAMESPACE]


def test_hostpath_is_mounted_at_the_models_root_dir() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    container = _container()
    (root,) = _arg(container, "models-root-dir")
    host = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == root]
    assert len(host) == 1, f"no hostPath volume for --models-root-dir {root}"
    assert host[0]["hostPath"]["type"] == "DirectoryOrCreate"
    mounts = [m for m in container["volumeMounts"] if m["name"] == host[0]["name"]]
    assert len(mounts) == 1
    assert mounts[0]["mountPath"] == root
    assert not mounts[0].get("readOnly", False)
    # Every other allowed root is a hostPath mounted at its own path as well.
    for extra in _arg(container, "allowed-root"):
        assert any(m["mountPath"] == extra for m in container["volumeMounts"]), extra


def test_node_name_comes_from_the_downward_api() -> None:
    env = {e["name"]: e for e in _container()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_pod_is_hardened_and_probed() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    container = _container()
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not sc["capabilities"].get("add")
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["runAsNonRoot"] is (sc["runAsUser"] != 0)
    assert pod["serviceAccountName"] == _service_account()[1]
    assert "priorityClassName" not in pod  # none by default, as OME's v1.3 chart (deploy/README.md, Priority)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # /tmp is the only writable scratch space.
    tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp[0]["name"])

    (port,) = _arg(container, "port")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(port)
    assert container["startupProbe"]["httpGet"]["path"] == "/livez"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    annotations = _one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["cpu"] and resources["limits"]["memory"]


# ---------------------------------------------------------------------------------------------------- RBAC


def _rules(kind: str, name: str) -> list[Doc]:
    return list(_one(kind, name).get("rules") or [])


def test_no_rule_uses_a_wildcard() -> None:
    roles = [d for d in _docs() if d["kind"] in {"ClusterRole", "Role"}]
    assert roles
    for doc in roles:
        for rule in doc.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (doc["kind"], doc["metadata"]["name"], rule)
            assert not rule.get("nonResourceURLs"), doc["metadata"]["name"]


def test_nothing_bound_cluster_wide_grants_secrets() -> None:
    bound = [d["roleRef"]["name"] for d in _docs() if d["kind"] == "ClusterRoleBinding"]
    assert bound, "the agent needs a ClusterRoleBinding for its cluster-wide reads"
    for name in bound:
        for rule in _rules("ClusterRole", name):
            assert "secrets" not in rule["resources"], f"ClusterRole {name} grants secrets cluster-wide"


def test_cluster_role_grants_exactly_the_cluster_wide_api_use() -> None:
    (binding,) = [d for d in _docs() if d["kind"] == "ClusterRoleBinding"]
    ns, sa = _service_account()
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in _rules("ClusterRole", binding["roleRef"]["name"])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == {
        ("ome.io", "basemodels"): {"get", "list", "watch", "patch"},
        ("ome.io", "clusterbasemodels"): {"get", "list", "watch", "patch"},
        ("", "nodes"): {"get", "list", "watch", "patch"},
        ("", "events"): {"create", "patch"},
        ("authentication.k8s.io", "tokenreviews"): {"create"},  # the peer server checks peer tokens
    }


def test_role_is_namespaced_and_bound_to_the_agent() -> None:
    (role,) = [d for d in _docs() if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == NAMESPACE
    granted = {
        (g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted == {
        ("", "configmaps"): {"get", "list", "watch", "create", "patch"},
        ("", "secrets"): {"get"},
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    }
    (binding,) = [d for d in _docs() if d["kind"] == "RoleBinding"]
    ns, sa = _service_account()
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]


def test_model_secrets_cluster_role_is_get_only_and_unbound() -> None:
    roles = [d for d in _docs() if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-model-secrets")]
    assert len(roles) == 1
    assert roles[0]["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    bound = {d["roleRef"]["name"] for d in _docs() if d["kind"] in {"ClusterRoleBinding", "RoleBinding"}}
    assert roles[0]["metadata"]["name"] not in bound


# ---------------------------------------------------------------------------------------------- admission


GUARDS = ("node-guard", "configmap-guard", "model-guard", "lease-guard")
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def _policy(guard: str) -> Doc:
    return _one("ValidatingAdmissionPolicy", f"model-agent-{guard}")


def _variable(policy: Doc, name: str) -> str:
    (expression,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(expression)


def _name_pattern(policy: Doc) -> re.Pattern[str]:
    """The one name regex a policy tests with CEL ``matches`` (RE2; these patterns are plain enough for re)."""
    (pattern,) = re.findall(r"matches\('([^']+)'\)", json.dumps(policy["spec"]))
    return re.compile(pattern)


def _cel_string_list(expression: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", expression)
    assert match, expression
    return re.findall(r"'([^']*)'", match.group(1))


def test_every_admission_policy_is_bound_fails_closed_and_matches_only_the_agent() -> None:
    policies = [d for d in _docs() if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [d for d in _docs() if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(p["metadata"]["name"] for p in policies) == sorted(f"model-agent-{g}" for g in GUARDS)
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(p["metadata"]["name"] for p in policies)
    ns, sa = _service_account()
    for policy in policies:
        name = policy["metadata"]["name"]
        (binding,) = [b for b in bindings if b["spec"]["policyName"] == name]
        assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert binding["spec"]["validationActions"] == ["Deny"], name
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail", name
        (condition,) = spec["matchConditions"]
        assert condition["expression"].strip() == f"request.userInfo.username == 'system:serviceaccount:{ns}:{sa}'"
        # A token minted outside a pod (no node-name claim) is refused by every guard.
        assert NODE_CLAIM in _variable(policy, "tokenNode"), name
        assert "variables.tokenNode != ''" in [v["expression"] for v in spec["validations"]], name
        for validation in spec["validations"]:
            assert validation.get("message"), (name, validation["expression"])
            assert validation.get("reason") == "Forbidden", (name, validation["expression"])


def test_node_guard_matches_node_updates_and_the_model_label_prefix() -> None:
    spec = _policy("node-guard")["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["operations"] == ["UPDATE"] and "nodes" in rule["resources"]
    assert MODEL_LABEL_PREFIX in json.dumps(spec)


def test_configmap_guard_allows_the_node_configmap_and_exactly_what_the_resolve_cache_writes() -> None:
    policy = _policy("configmap-guard")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["resources"] == ["configmaps"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    text = json.dumps(policy["spec"])
    assert f"request.namespace == '{NAMESPACE}'" in text
    assert "variables.name == variables.tokenNode" in text
    pattern = _name_pattern(policy)
    for uri in ("hf://meta-llama/Llama-3.1-8B", "s3://bucket/x", ""):
        assert pattern.fullmatch(ResolveCache.name(uri)), ResolveCache.name(uri)
    for other in (
        "model-agent-config-map",
        "model-agent-resolve-",
        "model-agent-resolve-XYZ",
        "n2",
        "kube-root-ca.crt",
    ):
        assert not pattern.fullmatch(other), other
    assert _cel_string_list(_variable(policy, "unknownKeys")) == ["uri", "commit", "files", "at"]


class _RecordingClient:
    """Answers the resolve cache's create with 409 (the record exists), so put sends its patch as well."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Doc]] = []

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Doc:
        self.sent.append((method, body))
        if method == "POST":
            raise ApiError(409, {"reason": "AlreadyExists"}, method, path)
        return {}


async def test_configmap_guard_keys_and_label_are_the_ones_the_resolve_cache_sends() -> None:
    policy = _policy("configmap-guard")
    allowed = set(_cel_string_list(_variable(policy, "unknownKeys")))
    client = _RecordingClient()
    await ResolveCache(cast(KubeClient, client), NAMESPACE).put("hf://org/m", "a" * 40, [{"path": "x", "size": 1}])
    (post, created), (patch, patched) = client.sent
    assert (post, patch) == ("POST", "PATCH")
    assert set(created["data"]) <= allowed and set(patched["data"]) <= allowed
    assert set(patched) == {"data"}, "the update may carry only data: labels are checked as they stand"
    labels = created["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/managed-by": "model-agent"}
    assert "== {'app.kubernetes.io/managed-by': 'model-agent'}" in json.dumps(policy["spec"])


def test_model_guard_allows_only_the_fields_the_agent_enriches(tmp_path: Path) -> None:
    policy = _policy("model-guard")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["ome.io"] and rule["operations"] == ["UPDATE"]
    assert sorted(rule["resources"]) == ["basemodels", "basemodels/*", "clusterbasemodels", "clusterbasemodels/*"]
    # What _enrich_spec may patch: the spec keys of a manifest's metadata record, for both model layouts.
    transformers = tmp_path / "llm"
    transformers.mkdir()
    (transformers / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    diffusers = tmp_path / "sd"
    diffusers.mkdir()
    (diffusers / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "StableDiffusionPipeline",
                "_diffusers_version": "0.30.0",
                "vae": ["diffusers", "AutoencoderKL"],
            }
        )
    )
    enriched = set()
    for model in (transformers, diffusers):
        enriched |= set(_metadata_record(parse_model_dir(model))["spec"])
    assert sorted(_cel_string_list(_variable(policy, "enrichable"))) == sorted(enriched)
    assert "storage" not in enriched
    # "Unset" is decided with size() for strings, lists and maps (the agent's _is_set: None, "", [], {}).
    overwritten = _variable(policy, "overwritten")
    assert "size(variables.oldSpec[k]) == 0" in overwritten and "== null" in overwritten
    text = json.dumps(policy["spec"])
    for field in ("labels", "annotations", "finalizers", "ownerReferences"):
        assert f"object.metadata.{field}" in text, field


def test_lease_guard_allows_exactly_the_origin_slot_names() -> None:
    policy = _policy("lease-guard")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    assert f"request.namespace == '{NAMESPACE}'" in json.dumps(policy["spec"])
    pattern = _name_pattern(policy)
    for source in ("hf://meta-llama/Llama-3.1-8B", "resolve:hf://org/m", "s3://b/k"):
        for name in lease_names(source, 12):
            assert pattern.fullmatch(name), name
    for other in ("ome-controller-leader", "origin-", "origin-abc-0", "origin-" + "0" * 20 + "-x", "kube-scheduler"):
        assert not pattern.fullmatch(other), other
    assert "variables.holder == variables.tokenNode" in json.dumps(policy["spec"])


# ------------------------------------------------------------------------------------------ chart defaults


def test_chart_metadata_and_values_match_the_manifests() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "model-agent"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    container = _container()
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert _arg(container, "models-root-dir") == [values["modelsRootDir"]]
    assert _arg(container, "port") == [str(values["agent"]["port"])]
    assert _arg(container, "log-level") == [values["agent"]["logLevel"]]
    for flag, value in values["agent"]["flags"].items():
        assert _arg(container, flag) == ([] if value is None else [str(value)]), flag
    assert container["resources"] == values["resources"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod.get("priorityClassName", "") == values["priorityClassName"]
    assert _arg(container, "num-download-worker") == [str(values["numDownloadWorkers"])]
    assert _arg(container, "num-high-priority-worker") == [str(values["numHighPriorityWorkers"])]
    assert _arg(container, "model-verification-concurrency") == [str(values["modelVerificationConcurrency"])]
    assert container["securityContext"]["runAsUser"] == values["securityContext"]["runAsUser"]
    assert container["image"] == f"{values['image']['repository']}:{chart['appVersion']}"
    for template in ("daemonset.yaml", "rbac.yaml", "model-secrets-rbac.yaml", "admission-policy.yaml"):
        assert (CHART / "templates" / template).is_file(), template


def _without_helm_labels(doc: Doc) -> Doc:
    doc = json.loads(json.dumps(doc))
    metas = [doc["metadata"], doc.get("spec", {}).get("template", {}).get("metadata", {})]
    for meta in metas:
        for label in ("helm.sh/chart", "app.kubernetes.io/managed-by"):
            meta.get("labels", {}).pop(label, None)
    return doc


def test_helm_template_defaults_equal_the_manifests() -> None:
    helm = helm_binary()
    assert helm.is_file(), f"helm is not built: run `python -m testbed build --with-helm` ({helm})"
    out = subprocess.run(
        [str(helm), "template", "model-agent", str(CHART), "--namespace", NAMESPACE],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rendered = {
        (d["kind"], d["metadata"]["name"]): _without_helm_labels(d) for d in yaml.safe_load_all(out) if d is not None
    }
    plain = {(d["kind"], d["metadata"]["name"]): _without_helm_labels(d) for d in _docs() if d["kind"] != "Namespace"}
    assert rendered == plain


# ----------------------------------------------------------------------------------------------- dashboard


def _exposed_series() -> set[str]:
    """Every sample name a scrape of Metrics() can show (labelled families may have no samples yet)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def _dashboard_queries(dashboard: Doc) -> list[str]:
    queries: list[str] = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            queries.extend(t["expr"] for t in inner.get("targets", []) if "expr" in t)
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        queries.append(query.get("query", "") if isinstance(query, dict) else str(query or ""))
        queries.append(str(variable.get("definition", "")))
    return queries


# An OME operator's values for its v1.3 model agent, under the names OME's chart gives them.
OME_V13_VALUES = {
    "numDownloadWorkers": "3",
    "numHighPriorityWorkers": "2",
    "samePathWaitTimeout": "45m",
    "modelVerificationConcurrency": "4",
    "taskSchedulerCapacity": "100",
    "health.port": "9100",
    "podMonitor.enabled": "true",
    "podMonitor.interval": "15s",
    "podMonitor.labels.release": "prometheus",
    "priorityClassName": "ome-high",
}


def test_the_chart_renders_omes_v13_value_names() -> None:
    helm = helm_binary()
    assert helm.is_file(), f"helm is not built: run `python -m testbed build --with-helm` ({helm})"
    sets = [part for key, value in OME_V13_VALUES.items() for part in ("--set", f"{key}={value}")]
    out = subprocess.run(
        [str(helm), "template", "model-agent", str(CHART), "--namespace", NAMESPACE, *sets],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = {d["kind"]: d for d in yaml.safe_load_all(out) if d is not None}
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert _arg(container, "num-download-worker") == ["3"]
    assert _arg(container, "num-high-priority-worker") == ["2"]
    assert _arg(container, "same-path-wait-timeout") == ["45m"]
    assert _arg(container, "model-verification-concurrency") == ["4"]
    assert not [a for a in container["args"] if "capacity" in str(a)]  # taskSchedulerCapacity: nothing to set here
    assert _arg(container, "port") == ["9100"]
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container["ports"]
    assert pod["priorityClassName"] == "ome-high"
    monitor = docs["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels(docs["DaemonSet"]).items()
    health_rule = [r for r in docs["NetworkPolicy"]["spec"]["ingress"] if r["ports"][0]["port"] != 8090]
    assert health_rule[0]["ports"] == [{"protocol": "TCP", "port": 9100}]


def pod_labels(daemonset: Doc) -> dict[str, str]:
    return cast(dict[str, str], daemonset["spec"]["template"]["metadata"]["labels"])


def test_dashboard_uses_only_exposed_metric_names() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "node"} <= variables
    used = {name for query in _dashboard_queries(dashboard) for name in re.findall(r"\bmodel_agent_\w+", query)}
    assert used, "the dashboard queries no model_agent metric"
    exposed = _exposed_series()
    assert used <= exposed, f"not exposed by Metrics(): {sorted(used - exposed)}"
    expected = {
        "model_agent_models",
        "model_agent_fetched_bytes_total",
        "model_agent_download_bytes_total",
        "model_agent_downloads_success_total",
        "model_agent_downloads_failed_total",
        "model_agent_delete_confirmations_total",
        "model_agent_delete_breaker_open",
        "model_agent_delete_breaker_trips_total",
        "model_agent_quarantined_total",
        "model_agent_restored_total",
        "model_agent_purged_total",
        "model_agent_drift_repairs_total",
        "model_agent_workqueue_depth",
        "model_agent_workqueue_wait_seconds_bucket",
        "model_agent_relists_total",
        "model_agent_api_request_duration_seconds_bucket",
        "model_agent_rbac_denied_total",
    }
    assert expected <= used, f"panels missing for: {sorted(expected - used)}"


def test_dashboard_panels_have_unique_ids_and_a_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_the_network_policy_admits_the_peer_port_only_from_agent_pods() -> None:
    policy = _one("NetworkPolicy")
    pods = policy["spec"]["podSelector"]["matchLabels"]
    assert pods == _one("DaemonSet")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peer, health = policy["spec"]["ingress"]
    assert peer["from"] == [{"podSelector": {"matchLabels": pods}}]
    ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    assert peer["ports"] == [{"protocol": "TCP", "port": ports["peers"]}]
    assert health["ports"] == [{"protocol": "TCP", "port": int(_arg(_container(), "port")[0])}]
    assert "from" not in health  # (the chart's networkPolicy.healthFrom narrows it)
