"""model/key_owners.py: labels and ConfigMap keys map back to real models, never to a truncation's name.

The trap: a long name's label is ``hash8-tail``; parsed on its own it names a model that
never existed, whose live read answers 404 — "proof" that a model is gone whose real name was never read.
"""

from __future__ import annotations

import json
import random
import string

import pytest

from model_agent.model.key_owners import (
    CONFIGMAP_BUDGETS,
    LABEL_BUDGETS,
    Budgets,
    Owners,
    may_be_truncated,
    resolve,
)
from model_agent.model.keys import ModelKind, parse_configmap_key
from model_agent.model.resources import ModelRef
from tests.support.hostile_json import DEEP

CBM, BM = ModelKind.CLUSTER_BASE_MODEL, ModelKind.BASE_MODEL

SHORT = ModelRef(CBM, "", "qwen3-8b")
LONG = ModelRef(CBM, "", "meta-llama-3-1-70b-instruct-fp8-dynamic")  # 39 > 32: label truncated, key not
HUGE = ModelRef(CBM, "", "m" * 240)  # > 236: the ConfigMap key is truncated too
BM_LONG_NAME = ModelRef(BM, "team-a", "mistral-7b-instruct-v0-3-awq-4bit")  # 6 + 33 > 38
BM_LONG_NS = ModelRef(BM, "a-rather-long-namespace-name", "x")  # 28 + 1 <= 38: nothing truncated
BM_HASHED_NS = ModelRef(BM, "a-namespace-that-is-far-too-long-for-a-label", "llama")  # ns hashed in the label
BM_HUGE = ModelRef(BM, "research-team-namespace", "n" * 240)  # both parts truncated in the ConfigMap key


def entry(ref: ModelRef, status: str = "Ready") -> str:
    return json.dumps({"name": ref.name, "status": status})


def owners_of(
    *,
    real: tuple[ModelRef, ...] = (),
    entries: tuple[ModelRef, ...] = (),
    labels: tuple[ModelRef, ...] = (),
    raw_entries: dict[str, str] | None = None,
    raw_labels: tuple[str, ...] = (),
) -> Owners:
    data = {r.configmap_key: entry(r) for r in entries} | (raw_entries or {})
    return resolve([r.key for r in real], data, [r.label_key for r in labels] + list(raw_labels))


def test_budgets_are_the_key_functions_own() -> None:
    assert Budgets(cluster=32, basemodel=38) == LABEL_BUDGETS
    assert Budgets(cluster=236, basemodel=242) == CONFIGMAP_BUDGETS


def test_the_trap_exists_a_truncated_label_parses_to_a_name_no_object_has() -> None:
    # What the runtime did before: parse the label's name part as a ConfigMap key.
    parsed = parse_configmap_key(LONG.label_key.removeprefix("models.ome.io/"))
    assert parsed is not None and parsed.name != LONG.name
    assert ModelRef(parsed.kind, parsed.namespace, parsed.name).label_key == LONG.label_key  # it even round-trips


# (case, owners_of kwargs, label owners, configmap owners, unresolved (where, why-prefix))
CASES = [
    ("short label, nothing else: parsed (a real name)", {"labels": (SHORT,)}, {SHORT: {SHORT}}, {}, []),
    ("short entry, nothing else: parsed", {"entries": (SHORT,)}, {}, {SHORT: {SHORT}}, []),
    (
        "truncated label alone: no real name, left alone",
        {"labels": (LONG,)},
        {},
        {},
        [("label", "truncated")],
    ),
    ("truncated label, cached object or manifest", {"real": (LONG,), "labels": (LONG,)}, {LONG: {LONG}}, {}, []),
    (
        "truncated label, untruncated ConfigMap key names the model",
        {"entries": (LONG,), "labels": (LONG,)},
        {LONG: {LONG}},
        {LONG: {LONG}},
        [],
    ),
    (
        "ConfigMap key truncated too: the entry's name recovers both",
        {"entries": (HUGE,), "labels": (HUGE,)},
        {HUGE: {HUGE}},
        {HUGE: {HUGE}},
        [],
    ),
    (
        "truncated BaseModel name: the ConfigMap key recovers the label",
        {"entries": (BM_LONG_NAME,), "labels": (BM_LONG_NAME,)},
        {BM_LONG_NAME: {BM_LONG_NAME}},
        {BM_LONG_NAME: {BM_LONG_NAME}},
        [],
    ),
    (
        "truncated BaseModel name, label alone: left alone",
        {"labels": (BM_LONG_NAME,)},
        {},
        {},
        [("label", "truncated")],
    ),
    ("BaseModel short enough: parsed", {"labels": (BM_LONG_NS,)}, {BM_LONG_NS: {BM_LONG_NS}}, {}, []),
    (
        "hashed namespace in the label: only the entry's key knows it",
        {"entries": (BM_HASHED_NS,), "labels": (BM_HASHED_NS,)},
        {BM_HASHED_NS: {BM_HASHED_NS}},
        {BM_HASHED_NS: {BM_HASHED_NS}},
        [],
    ),
    (
        "hashed namespace in the label, alone: left alone",
        {"labels": (BM_HASHED_NS,)},
        {},
        {},
        [("label", "truncated")],
    ),
    (
        "hashed namespace in the ConfigMap key: the entry's name is not enough",
        {"entries": (BM_HUGE,), "labels": (BM_HUGE,)},
        {},
        {},
        [("configmap", "truncated"), ("label", "truncated")],
    ),
    (
        "hashed namespace in the ConfigMap key, manifest knows it",
        {"real": (BM_HUGE,), "entries": (BM_HUGE,), "labels": (BM_HUGE,)},
        {BM_HUGE: {BM_HUGE}},
        {BM_HUGE: {BM_HUGE}},
        [],
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "by_label", "by_cm", "unresolved"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_owners(
    kwargs: dict[str, tuple[ModelRef, ...]],
    by_label: dict[ModelRef, set[ModelRef]],
    by_cm: dict[ModelRef, set[ModelRef]],
    unresolved: list[tuple[str, str]],
) -> None:
    owners = owners_of(**kwargs)  # type: ignore[arg-type]
    assert owners.by_label == {k.label_key: frozenset(r.key for r in v) for k, v in by_label.items()}
    assert owners.by_configmap_key == {k.configmap_key: frozenset(r.key for r in v) for k, v in by_cm.items()}
    got = sorted((u.where, u.why.split(":")[0]) for u in owners.unresolved)
    assert got == sorted(unresolved)


@pytest.mark.parametrize(
    ("raw_entries", "raw_labels", "why"),
    [
        ({}, ("models.ome.io/not-a-model",), "not a model key"),
        ({}, ("models.ome.io/clusterbasemodel." + "a" * 40,), "not a key the agent writes"),  # over the budget
        ({LONG.configmap_key[:-1] + "x" * 200: "not json"}, (), "not a key the agent writes"),
        ({HUGE.configmap_key: "{garbled"}, (), "truncated"),
        ({HUGE.configmap_key: json.dumps({"name": "someone-else", "status": "Ready"})}, (), "truncated"),
        ({"team-a.basemodel.": "{}"}, (), "not a model key"),
        ({HUGE.configmap_key: DEEP}, (), "truncated"),  # nested past any recursion limit
    ],
    ids=[
        "foreign label",
        "over-budget label",
        "over-budget key",
        "garbled entry",
        "entry of another",
        "empty name",
        "deeply nested entry",
    ],
)
def test_what_maps_to_nothing(raw_entries: dict[str, str], raw_labels: tuple[str, ...], why: str) -> None:
    owners = owners_of(raw_entries=raw_entries, raw_labels=raw_labels)
    assert owners.keys() == set()
    assert [u.why for u in owners.unresolved] and all(u.why.startswith(why) for u in owners.unresolved)


def test_labels_outside_the_model_domain_are_not_ours() -> None:
    owners = owners_of(raw_labels=("kubernetes.io/hostname",))
    assert owners.keys() == set() and owners.unresolved == []


def test_an_entry_naming_its_own_truncated_key_is_believed() -> None:
    # A ClusterBaseModel whose real (short) name looks like a truncation: the entry says it is the name.
    looks_hashed = ModelRef(CBM, "", "0123abcd-" + "z" * 23)  # exactly 32, hash-like
    assert may_be_truncated(CBM, "", looks_hashed.name, LABEL_BUDGETS)
    assert owners_of(labels=(looks_hashed,)).keys() == set()
    assert owners_of(entries=(looks_hashed,), labels=(looks_hashed,)).keys() == {looks_hashed.key}


def _random_ref(rng: random.Random) -> ModelRef:
    alphabet = string.ascii_lowercase + string.digits + "-"

    def name(n: int) -> str:
        return rng.choice(string.ascii_lowercase) + "".join(rng.choice(alphabet) for _ in range(n - 1))

    if rng.random() < 0.5:
        return ModelRef(CBM, "", name(rng.randint(1, 253)))
    return ModelRef(BM, name(rng.randint(1, 63)), name(rng.randint(1, 253)))


@pytest.mark.parametrize("seed", range(5))
def test_never_a_name_that_never_existed(seed: int) -> None:
    # Whatever survives of a model (its label, its entry, either, with or without the entry's JSON), the keys
    # it maps back to are that model's or none: never a name parsed out of a truncation.
    rng = random.Random(seed)
    for _ in range(400):
        ref = _random_ref(rng)
        for data in ({}, {ref.configmap_key: entry(ref)}, {ref.configmap_key: "{}"}):
            for labels in ([], [ref.label_key]):
                owners = resolve([], data, labels)
                assert owners.keys() <= {ref.key}, (ref, data, labels)
                mapped = set(owners.by_label) | set(owners.by_configmap_key)
                assert mapped | {u.key for u in owners.unresolved} == set(data) | set(labels)
        # With its record on disk (or the object cached), everything of it maps to it.
        full = resolve([ref.key], {ref.configmap_key: entry(ref)}, [ref.label_key])
        assert full.keys() == {ref.key} and full.unresolved == []
