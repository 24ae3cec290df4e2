"""The caps on one namespace's entries and labels per node, Failed and Ready/Updating (agent/namespace_quota.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from model_agent.agent.namespace_quota import admit, failed_quota, models_quota
from model_agent.model.entry import ModelEntry
from model_agent.model.keys import ModelKind
from model_agent.model.resources import ModelRef


@pytest.mark.parametrize(
    ("namespace", "shown", "holders", "limit", "admitted"),
    [
        ("", False, 10_000, 50, True),  # ClusterBaseModels are the admin's: never capped
        ("team-evil", False, 0, 50, True),
        ("team-evil", False, 49, 50, True),  # the 50th
        ("team-evil", False, 50, 50, False),  # the 51st
        ("team-evil", True, 50, 50, True),  # already shows Failed here: keeps its place
        ("team-evil", True, 500, 50, True),  # (the cap was lowered since)
        ("team-evil", False, 10_000, 0, True),  # 0: no cap
    ],
)
def test_admit(namespace: str, shown: bool, holders: int, limit: int, admitted: bool) -> None:
    assert admit(namespace, shown, holders, limit) is admitted


def failed(name: str) -> str:
    return ModelEntry(name=name, status="Failed").to_json()


def ref(namespace: str, name: str) -> ModelRef:
    return ModelRef(ModelKind.BASE_MODEL, namespace, name)


def test_the_books_follow_what_the_node_shows() -> None:
    registry = CollectorRegistry()
    quota = failed_quota(2, registry)
    data: dict[str, str] = {}
    # Another namespace's failures and a Ready model of the same namespace take no place.
    data[ref("team-good", "x").configmap_key] = failed("x")
    data[ref("team-evil", "ready").configmap_key] = ModelEntry(name="ready", status="Ready").to_json()
    for name in ("a", "b"):
        assert quota.decide(ref("team-evil", name), None, data).admitted
        data[ref("team-evil", name).configmap_key] = failed(name)
    third = quota.decide(ref("team-evil", "c"), None, data)
    assert (third.admitted, third.newly_refused) == (False, True)
    again = quota.decide(ref("team-evil", "c"), None, data)
    assert (again.admitted, again.newly_refused) == (False, False)  # reported once, not on every reconcile
    assert registry.get_sample_value("model_agent_failed_entries_refused_total", {"namespace": "team-evil"}) == 1
    assert quota.decide(ref("team-good", "y"), None, data).admitted  # namespaces are counted apart
    assert quota.decide(ref("team-evil", "a"), "Failed", data).admitted  # a holder stays
    # One holder is fixed (its entry says Ready now): the refused model gets its place at its next decision.
    data[ref("team-evil", "b").configmap_key] = ModelEntry(name="b", status="Ready").to_json()
    assert quota.decide(ref("team-evil", "c"), None, data).admitted


def test_a_restart_starts_from_the_configmap() -> None:
    data = {ref("team-evil", n).configmap_key: failed(n) for n in ("a", "b")}
    quota = failed_quota(2, CollectorRegistry())  # a new process: the books are read from the node's ConfigMap
    assert not quota.decide(ref("team-evil", "new"), None, data).admitted
    assert quota.decide(ref("team-evil", "a"), None, data).admitted


def test_admitted_entries_not_written_yet_keep_their_place() -> None:
    """Writes are batched: the decisions of many models failing at once see none of the others' entries yet."""
    quota = failed_quota(2, CollectorRegistry())
    data: dict[str, str] = {}
    decisions = [quota.decide(ref("team-evil", f"m{i}"), None, data).admitted for i in range(5)]
    assert decisions == [True, True, False, False, False]
    for i in (0, 1):  # written, then one of them removed (its model deleted): its place is free again
        data[ref("team-evil", f"m{i}").configmap_key] = failed(f"m{i}")
    assert not quota.decide(ref("team-evil", "m2"), None, data).admitted
    del data[ref("team-evil", "m0").configmap_key]
    assert quota.decide(ref("team-evil", "m2"), None, data).admitted


def test_an_admitted_entry_still_showing_its_earlier_state_keeps_its_place() -> None:
    quota = failed_quota(1, CollectorRegistry())
    updating = ModelEntry(name="m0", status="Updating").to_json()
    data = {ref("team-evil", "m0").configmap_key: updating, ref("team-evil", "m1").configmap_key: updating}
    assert quota.decide(ref("team-evil", "m0"), "Updating", data).admitted
    assert not quota.decide(ref("team-evil", "m1"), "Updating", data).admitted  # m0's Failed write is pending


def shows(name: str, status: str) -> str:
    return ModelEntry(name=name, status=status).to_json()


def test_the_models_cap_counts_ready_and_updating_and_frees_on_release() -> None:
    registry = CollectorRegistry()
    quota = models_quota(2, registry)
    data = {
        ref("team-evil", "r").configmap_key: shows("r", "Ready"),
        ref("team-evil", "u").configmap_key: shows("u", "Updating"),
        ref("team-evil", "f").configmap_key: shows("f", "Failed"),  # Failed takes no place of this cap
    }
    refused = quota.decide(ref("team-evil", "new"), None, data)
    assert (refused.admitted, refused.newly_refused) == (False, True)
    assert registry.get_sample_value("model_agent_models_refused_total", {"namespace": "team-evil"}) == 1
    assert quota.decide(ref("team-evil", "r"), "Ready", data).admitted  # a holder keeps its place
    assert quota.decide(ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", "admin"), None, data).admitted
    quota.release(ref("team-evil", "u"))  # the reconciler shows it Failed now (its write not seen yet)
    data[ref("team-evil", "u").configmap_key] = shows("u", "Failed")
    assert quota.decide(ref("team-evil", "new"), None, data).admitted


def test_an_admitted_model_that_is_removed_before_its_first_write_gives_its_place_back() -> None:
    quota = models_quota(1, CollectorRegistry())
    data: dict[str, str] = {}
    assert quota.decide(ref("team-evil", "a"), None, data).admitted
    assert not quota.decide(ref("team-evil", "b"), None, data).admitted  # a's Updating write is pending
    quota.release(ref("team-evil", "a"))  # removed (deleted) before any write of it was seen
    assert quota.decide(ref("team-evil", "b"), None, data).admitted
