"""Static checks of deploy/: plain manifests, Helm chart defaults and the Grafana dashboard, without helm.

What must hold for the agent to work (and to stay least-privilege) whatever else changes:
* every YAML under deploy/manifests parses, and the kustomization lists exactly those files;
* the DaemonSet mounts the hostPath at the same path it passes as --models-root-dir, takes NODE_NAME from
  spec.nodeName, runs hardened, and probes /livez and /readyz;
* nothing bound cluster-wide grants Secrets, no rule uses a wildcard, the Role is namespaced;
* the admission policy matches exactly the agent's ServiceAccount;
* the manifests agree with the chart's values.yaml defaults (and with ``helm template`` when helm is on
  PATH);
* every ``model_agent_*`` series the dashboard queries is exposed by :class:`model_agent.ops.metrics.Metrics`.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_agent.devenv.controlplane import helm_binary
from model_agent.ops.metrics import Metrics

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
    return containers[0]


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
    assert pod["priorityClassName"] == "system-node-critical"
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


def test_admission_policy_matches_only_the_agent_on_node_updates() -> None:
    policy = _one("ValidatingAdmissionPolicy")
    binding = _one("ValidatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["operations"] == ["UPDATE"] and "nodes" in rule["resources"]
    ns, sa = _service_account()
    (condition,) = spec["matchConditions"]
    assert condition["expression"].strip() == f"request.userInfo.username == 'system:serviceaccount:{ns}:{sa}'"
    text = json.dumps(spec)
    assert "authentication.kubernetes.io/node-name" in text
    assert MODEL_LABEL_PREFIX in text
    for validation in spec["validations"]:
        assert validation.get("message"), validation["expression"]


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
    assert pod["priorityClassName"] == values["priorityClassName"]
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
    assert helm.is_file(), f"helm is not built: run `model-agent dev build --with-helm` ({helm})"
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
