"""Unit tests for the node ConfigMap's size accounting: every patch fits, a full ConfigMap is said loudly.

:func:`place` (the pure decision) is table-tested. :class:`NodeConfigMap` runs against
:class:`ConfigMapServer`, a fake of the API server's ConfigMap endpoint (merge patches, resourceVersions,
and the same refusal of an object whose data exceeds its limit; small limits keep the numbers readable).
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from model_agent.agent.configmap_space import data_bytes, entry_bytes, place
from model_agent.agent.node_configmap import MAX_BATCH_BYTES, ConfigMapFull, NodeConfigMap
from model_agent.agent.requeue import Requeue
from model_agent.kube.client import ApiError
from model_agent.model.entry import ModelConfig, ModelEntry, without_config
from model_agent.ops.events import ObjectRef
from model_agent.ops.metrics import Metrics

DEADLINE_S = 2.0
NS = "ome"
NODE = "node-1"
PATH = f"/api/v1/namespaces/{NS}/configmaps/{NODE}"


def ready(name: str, config_bytes: int = 0) -> str:
    config = ModelConfig(model_type="llama", decoded_model_configuration={"blob": "x" * config_bytes})
    return ModelEntry(name, "Ready", config=config if config_bytes else None).to_json()


# ------------------------------------------------------------------------------------- the decision


def small(value: str) -> str:
    return value[:3]


@pytest.mark.parametrize(
    ("current", "batch", "budget", "write", "compacted", "refused"),
    [
        # growth that fits goes whole
        ({}, {"a": "12345"}, 10, {"a": "12345"}, set(), {}),
        # growth that fits only in its smallest form goes small
        ({}, {"a": "123456789"}, 6, {"a": "123"}, {"a"}, {}),
        # no room even for the smallest form: refused, the key keeps its value
        ({"b": "xxxxxxxx"}, {"a": "123456789"}, 10, {}, set(), {"a": 4}),
        # a removal and a shrinking value always go, and first: they make room for the growth after them
        (
            {"b": "xxxxxxxx", "c": "yyyy"},
            {"a": "1234", "b": None, "c": "y"},
            10,
            {"b": None, "c": "y", "a": "1234"},
            set(),
            {},
        ),
        # first come, first served among growing keys
        ({}, {"a": "1234", "b": "5678"}, 6, {"a": "1234"}, set(), {"b": 4}),
        # a key's own current value is credited: rewriting it costs only the difference
        ({"a": "12345678"}, {"a": "123456789"}, 10, {"a": "123456789"}, set(), {}),
    ],
)
def test_place(
    current: dict[str, str],
    batch: dict[str, str | None],
    budget: int,
    write: dict[str, str | None],
    compacted: set[str],
    refused: dict[str, int],
) -> None:
    placement = place(current, batch, budget, small)
    assert placement.write == write
    assert list(placement.write) == list(write)
    assert placement.compacted == compacted
    assert dict(placement.refused) == refused
    after = {**current, **{k: v for k, v in write.items() if v is not None}}
    for k, v in write.items():
        if v is None:
            after.pop(k, None)
    assert placement.used_bytes == data_bytes(after) <= max(budget, data_bytes(current))


def test_entries_already_written_give_up_their_config_for_a_status_never_another_writers_key() -> None:
    current = {"foreign": "ffffffff", "g1": "gggggg", "g2": "hhhhhhhhhh"}  # 15 + 8 + 12 = 35 bytes
    # "a" needs 4 bytes even small: g2 (the largest saving, 7) gives up its config, g1 need not.
    placement = place(current, {"a": "123456789"}, 33, small, ours=lambda k: k.startswith("g"))
    assert placement.write == {"g2": "hhh", "a": "123"}
    assert placement.compacted == {"g2", "a"}
    assert dict(placement.refused) == {}
    # With every entry already small (and another writer's key never touched), the key is refused.
    placement = place({"foreign": "f" * 20, "g1": "ggg"}, {"a": "123456789"}, 34, small, ours=lambda k: k != "foreign")
    assert placement.write == {} and dict(placement.refused) == {"a": 4}


# --------------------------------------------------------------------------------------- the writer


class ConfigMapServer:
    """A fake of the API server for one ConfigMap: GET, POST, merge PATCH; refuses data over ``limit``."""

    def __init__(self, limit: int, data: dict[str, str] | None = None) -> None:
        self.limit = limit
        self.rv = 1
        self.obj: dict[str, Any] | None = None
        if data is not None:
            self.obj = {"metadata": {"name": NODE, "namespace": NS, "resourceVersion": "1"}, "data": dict(data)}
        self.patches: list[dict[str, Any]] = []
        self.refusals = 0

    def _too_long(self) -> ApiError:
        self.refusals += 1
        message = f'ConfigMap "{NODE}" is invalid: []: Too long: must have at most {self.limit} bytes'
        return ApiError(422, {"kind": "Status", "reason": "Invalid", "message": message, "code": 422}, "PATCH", PATH)

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "GET":
            if self.obj is None:
                raise ApiError(404, {"reason": "NotFound"}, method, path)
            return copy.deepcopy(self.obj)
        if method == "PATCH":
            if self.obj is None:
                raise ApiError(404, {"reason": "NotFound"}, method, path)
            self.patches.append(copy.deepcopy(body))
            data = dict(self.obj.get("data") or {})
            for k, v in (body.get("data") or {}).items():
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            if data_bytes(data) > self.limit:
                raise self._too_long()
            self.rv += 1
            self.obj = {**self.obj, "data": data, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
            return copy.deepcopy(self.obj)
        if method == "POST":
            if data_bytes(body.get("data") or {}) > self.limit:
                raise self._too_long()
            self.rv += 1
            self.obj = copy.deepcopy(body)
            self.obj["metadata"]["resourceVersion"] = str(self.rv)
            return copy.deepcopy(self.obj)
        raise AssertionError(f"unexpected {method} {path}")

    def drop(self, key: str) -> None:
        """Another writer removes ``key`` (a new resourceVersion, as any change has)."""
        assert self.obj is not None
        self.rv += 1
        data = {k: v for k, v in self.data.items() if k != key}
        self.obj = {**self.obj, "data": data, "metadata": {**self.obj["metadata"], "resourceVersion": str(self.rv)}}

    @property
    def data(self) -> dict[str, str]:
        return dict((self.obj or {}).get("data") or {})


class Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[ObjectRef, str, str, str]] = []

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.emitted.append((ref, type_, reason, message))


def writer(server: ConfigMapServer, budget: int, *, watched: bool = True) -> tuple[NodeConfigMap, Events, Metrics]:
    events, metrics = Events(), Metrics()
    node = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "uid": "node-uid"}}
    cm = NodeConfigMap(
        server,  # type: ignore[arg-type]
        NS,
        NODE,
        (lambda: server.obj) if watched else (lambda: None),
        budget_bytes=budget,
        events=events,  # type: ignore[arg-type]
        metrics=metrics,
        node_object=lambda: node,
    )
    return cm, events, metrics


def gauge(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None
    return value


async def ensure_all(cm: NodeConfigMap, values: dict[str, str | None]) -> dict[str, BaseException | None]:
    """Ensure every key concurrently (one batch, as concurrent workers do); each key's outcome."""
    keys = list(values)
    results = await asyncio.wait_for(
        asyncio.gather(*(cm.ensure(k, values[k]) for k in keys), return_exceptions=True), DEADLINE_S
    )
    return {k: (r if isinstance(r, BaseException) else None) for k, r in zip(keys, results, strict=True)}


async def test_a_full_configmap_refuses_only_the_entries_that_do_not_fit_and_says_so() -> None:
    server = ConfigMapServer(limit=1000, data={"foreign": "f" * 700})
    cm, events, metrics = writer(server, budget=1000)
    values: dict[str, str | None] = {f"m{i}": ready(f"m{i}") for i in range(12)}  # 32 bytes each
    outcomes = await ensure_all(cm, values)
    refused = {k for k, e in outcomes.items() if e is not None}
    written = set(values) - refused
    assert refused and written
    assert all(isinstance(outcomes[k], ConfigMapFull) and isinstance(outcomes[k], Requeue) for k in refused)
    # Looked at again in about a minute (a state that ends when room appears), not with a backoff to 5 min.
    assert all(48 <= (getattr(outcomes[k], "delay_s", 0) or 0) <= 72 for k in refused)
    assert server.refusals == 0  # the server never saw a patch that would not fit
    assert {k for k in server.data if k != "foreign"} == written
    assert server.data["foreign"] == "f" * 700  # never touched
    assert data_bytes(server.data) <= 1000
    # Said loudly: one Warning on the Node, the gauges, usage() for /status.
    assert [(r.kind, r.name, t, reason) for r, t, reason, _ in events.emitted] == [
        ("Node", NODE, "Warning", "ConfigMapFull")
    ]
    assert gauge(metrics, "model_agent_configmap_full") == 1
    assert gauge(metrics, "model_agent_configmap_refused_entries") == len(refused)
    assert gauge(metrics, "model_agent_configmap_bytes") == data_bytes(server.data)
    usage = cm.usage()
    assert usage["full"] is True and usage["refused"] == sorted(refused)
    # Room appears (the foreign key goes): the refused entries are written on their retry, and it is said.
    server.drop("foreign")
    again = await ensure_all(cm, {k: values[k] for k in refused})
    assert all(e is None for e in again.values())
    assert not cm.full
    assert events.emitted[-1][2] == "ConfigMapRoom"
    assert gauge(metrics, "model_agent_configmap_full") == 0


async def test_an_entry_without_room_for_its_config_is_written_without_it_and_kept_so() -> None:
    server = ConfigMapServer(limit=600, data={"foreign": "f" * 400})
    cm, _, metrics = writer(server, budget=600)
    big = ready("m1", config_bytes=300)
    assert await asyncio.wait_for(cm.ensure("m1", big), DEADLINE_S) is True
    assert server.data["m1"] == without_config(big) == '{"name":"m1","status":"Ready"}'
    assert gauge(metrics, "model_agent_configmap_compacted_entries") == 1
    # The same wanted value again: no room yet, so no rewrite (no churn on every reconcile).
    patches = len(server.patches)
    assert await asyncio.wait_for(cm.ensure("m1", big), DEADLINE_S) is False
    assert len(server.patches) == patches
    # Room appears: the whole entry is written.
    server.drop("foreign")
    assert await asyncio.wait_for(cm.ensure("m1", big), DEADLINE_S) is True
    assert server.data["m1"] == big
    assert gauge(metrics, "model_agent_configmap_compacted_entries") == 0


async def test_the_server_counting_more_than_the_agent_knew_re_reads_and_places_again() -> None:
    # The agent's view is stale (no watch): a foreign key it never saw takes most of the room.
    server = ConfigMapServer(limit=400, data={"foreign": "f" * 300})
    cm, _, _ = writer(server, budget=400, watched=False)
    outcomes = await ensure_all(cm, {"a": "a" * 40, "b": "b" * 40, "c": "c" * 40})
    assert server.refusals == 1  # one refusal, then the batch was placed against the real object
    written = {k for k, e in outcomes.items() if e is None}
    assert written == {"a", "b"}
    assert isinstance(outcomes["c"], ConfigMapFull)
    assert {k for k in server.data if k != "foreign"} == written


async def test_batches_are_split_in_bytes() -> None:
    server = ConfigMapServer(limit=4 * 1024 * 1024, data={})
    cm, _, _ = writer(server, budget=4 * 1024 * 1024)
    values: dict[str, str | None] = {f"m{i}": json.dumps({"name": f"m{i}", "pad": "p" * 7000}) for i in range(100)}
    outcomes = await ensure_all(cm, values)
    assert all(e is None for e in outcomes.values())
    assert len(server.patches) >= 3
    assert all(sum(entry_bytes(k, v) for k, v in p["data"].items()) <= MAX_BATCH_BYTES for p in server.patches)
    assert server.data == values


async def test_an_oversized_entry_is_capped_once_and_not_rewritten() -> None:
    server = ConfigMapServer(limit=1024 * 1024, data={})
    cm, _, _ = writer(server, budget=1024 * 1024)
    huge = ready("m1", config_bytes=50_000)
    assert await asyncio.wait_for(cm.ensure("m1", huge), DEADLINE_S) is True
    stored = ModelEntry.from_json(server.data["m1"])
    assert stored is not None and stored.status == "Ready" and stored.config is not None
    assert stored.config.decoded_model_configuration is None and stored.config.model_type == "llama"
    assert await asyncio.wait_for(cm.ensure("m1", huge), DEADLINE_S) is False
    assert len(server.patches) == 1


async def test_removing_a_refused_key_clears_the_full_state() -> None:
    server = ConfigMapServer(limit=100, data={"foreign": "f" * 90})
    cm, _, _ = writer(server, budget=100)
    with pytest.raises(ConfigMapFull):
        await asyncio.wait_for(cm.ensure("m1", ready("m1")), DEADLINE_S)
    assert cm.full
    assert await asyncio.wait_for(cm.ensure("m1", None), DEADLINE_S) is False
    assert not cm.full


async def test_written_entries_give_up_their_config_so_every_status_is_written() -> None:
    server = ConfigMapServer(limit=3000, data={"foreign": "f" * 1000})
    cm, _, metrics = writer(server, budget=3000)
    first = {f"clusterbasemodel.m{i}": ready(f"m{i}", config_bytes=300) for i in range(4)}  # ~440 bytes each
    assert all(e is None for e in (await ensure_all(cm, dict(first))).values())
    assert all("config" in json.loads(server.data[k]) for k in first)
    later = {f"clusterbasemodel.n{i}": ready(f"n{i}", config_bytes=300) for i in range(10)}
    outcomes = await ensure_all(cm, dict(later))
    assert all(e is None for e in outcomes.values()), outcomes  # every status found room
    for key in [*first, *later]:
        entry = ModelEntry.from_json(server.data[key])
        assert entry is not None and entry.status == "Ready"
    assert server.data["foreign"] == "f" * 1000
    assert data_bytes(server.data) <= 3000
    assert gauge(metrics, "model_agent_configmap_compacted_entries") >= 10
    assert not cm.full
