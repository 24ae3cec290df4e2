"""Unit tests for :class:`Remover`, the one destructive path, with fakes for the API server and the Node.

Real: the layout, manifests and trash (in ``tmp_path``), the fetcher pool, the breaker and the metrics.
Fakes: :class:`FakeKubeClient` (scripted answers, no server) and small recorders standing in for the node
labels, the node ConfigMap and the event recorder. Every removal is bounded by ``asyncio.wait_for``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.breaker import Breaker
from model_agent.agent.confirm import Outcome
from model_agent.agent.fetcher import Fetcher, Job
from model_agent.agent.removal import Candidate, RemovalContext, Remover
from model_agent.agent.requeue import Requeue
from model_agent.kube.client import ApiError, ApiUnavailable
from model_agent.local.layout import Layout, token_for
from model_agent.local.manifest import FileRecord, Manifest, ManifestStore
from model_agent.local.trash import Trash
from model_agent.model.keys import RESERVE_MODEL_ARTIFACT_LABEL
from model_agent.model.resources import ModelKind, ModelRef
from model_agent.ops.events import ObjectRef
from model_agent.ops.metrics import Metrics
from tests.support.fake_kube import FakeKubeClient, not_found, status_error, type_not_found
from tests.support.hostile_json import DEEP, NOT_OBJECTS

DEADLINE_S = 2.0
NODE = "node-1"
NODE_PATH = f"/api/v1/nodes/{NODE}"
REF = ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", "m1")
MODEL_PATH = "/apis/ome.io/v1beta1/clusterbasemodels/m1"
UID = "uid-1"
NEW_UID = "uid-2"
URI = "hf://org/m1"
WEIGHTS = {"config.json": b'{"model_type": "llama"}', "model.safetensors": bytes(range(256)) * 16}


# ---------------------------------------------------------------------------------------------- fakes


class FakeNodeLabels:
    """A fake of NodeLabels: this Node's labels in memory; every ``ensure`` is recorded."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.values = dict(labels)
        self.ensured: list[tuple[str, str | None]] = []

    def labels(self) -> dict[str, str]:
        return dict(self.values)

    def model_labels(self) -> dict[str, str]:
        return {k: v for k, v in self.values.items() if k.startswith("models.ome.io/")}

    async def ensure(self, key: str, value: str | None) -> bool:
        self.ensured.append((key, value))
        if self.values.get(key) == value:
            return False
        if value is None:
            del self.values[key]
        else:
            self.values[key] = value
        return True


class FakeNodeConfigMap:
    """A fake of NodeConfigMap: the node ConfigMap's data in memory; every ``ensure`` is recorded."""

    def __init__(self, data: dict[str, str]) -> None:
        self.values = dict(data)
        self.ensured: list[tuple[str, str | None]] = []

    def data(self) -> dict[str, str]:
        return dict(self.values)

    async def ensure(self, key: str, value: str | None) -> bool:
        self.ensured.append((key, value))
        if self.values.get(key) == value:
            return False
        if value is None:
            del self.values[key]
        else:
            self.values[key] = value
        return True


@dataclass(frozen=True)
class Emitted:
    ref: ObjectRef
    type: str
    reason: str
    message: str


class FakeEvents:
    """A fake of EventRecorder: records every ``emit``."""

    def __init__(self) -> None:
        self.emitted: list[Emitted] = []

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.emitted.append(Emitted(ref, type_, reason, message))

    @property
    def reasons(self) -> list[str]:
        return [e.reason for e in self.emitted]


# ------------------------------------------------------------------------------------------- the setup


@dataclass
class Env:
    client: FakeKubeClient
    layout: Layout
    manifests: ManifestStore
    trash: Trash
    fetcher: Fetcher
    metrics: Metrics
    labels: FakeNodeLabels
    configmap: FakeNodeConfigMap
    events: FakeEvents
    ctx: RemovalContext
    remover: Remover
    dest: Path
    manifest: Manifest
    cached: list[dict[str, Any]] = field(default_factory=list)
    repaired: list[dict[str, Any]] = field(default_factory=list)

    def live(
        self,
        uid: str = UID,
        *,
        uri: str = URI,
        name: str = "m1",
        path: str | None = None,
        labels: dict[str, str] | None = None,
        deleting: bool = False,
        node_selector: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "uid": uid, "resourceVersion": "5", "labels": labels or {}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            meta["finalizers"] = ["example.com/hold"]
        storage: dict[str, Any] = {"storageUri": uri, "path": path or str(self.dest)}
        if node_selector:
            storage["nodeSelector"] = node_selector
        return {
            "apiVersion": "ome.io/v1beta1",
            "kind": "ClusterBaseModel",
            "metadata": meta,
            "spec": {"storage": storage},
        }

    def candidate(self, why: str = "watch DELETED") -> Candidate:
        return Candidate(REF, UID, self.manifests.load(REF.key), why)

    async def remove(self, why: str = "watch DELETED") -> bool:
        return await asyncio.wait_for(self.remover.remove(self.candidate(why)), DEADLINE_S)

    def confirmations(self, outcome: Outcome) -> float:
        value = self.metrics.registry.get_sample_value(
            "model_agent_delete_confirmations_total", {"outcome": outcome.value}
        )
        return value or 0.0

    def weights_in_place(self) -> bool:
        return read_tree(self.dest) == WEIGHTS

    def trash_entries(self) -> list[str]:
        return [e.id for e in self.trash.entries()]

    def assert_untouched(self) -> None:
        assert self.weights_in_place()
        assert self.trash_entries() == []
        assert self.labels.values[REF.label_key] == "Ready"
        assert self.configmap.values[REF.configmap_key] == '{"status": "Ready"}'
        assert self.labels.ensured == []
        assert self.configmap.ensured == []
        manifest = self.manifests.load(REF.key)
        assert manifest is not None
        assert manifest.uid == UID
        assert "Removed" not in self.events.reasons

    def assert_removed(self, *, weights_kept: bool) -> None:
        assert REF.label_key not in self.labels.values
        assert REF.configmap_key not in self.configmap.values
        assert (REF.label_key, None) in self.labels.ensured
        assert (REF.configmap_key, None) in self.configmap.ensured
        assert self.manifests.load(REF.key) is None
        assert "Removed" in self.events.reasons
        if weights_kept:
            assert self.weights_in_place()
            assert self.trash_entries() == []
        else:
            assert not self.dest.exists()
            entries = list(self.trash.entries())
            assert len(entries) == 1
            assert read_tree(entries[0].data) == WEIGHTS
            assert entries[0].manifest.uid == UID


def read_tree(directory: Path) -> dict[str, bytes]:
    if not directory.is_dir():
        return {}
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def node(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "gpu": "h100", **(labels or {})}},
    }


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    layout = Layout(tmp_path / "root")
    layout.ensure()
    dest = layout.primary.path / "models" / "m1"
    dest.mkdir(parents=True)
    for rel, data in WEIGHTS.items():
        (dest / rel).write_bytes(data)
    manifests = ManifestStore(layout)
    manifest = Manifest(
        key=REF.key,
        uid=UID,
        storage_uri=URI,
        dest=str(dest),
        revision="abc123",
        source_type="hf",
        files=[FileRecord(rel, len(data)) for rel, data in WEIGHTS.items()],
    )
    manifests.save(manifest, layout.primary)
    client = FakeKubeClient()
    fetcher = Fetcher(workers=1, on_done=lambda k: None)
    labels = FakeNodeLabels({REF.label_key: "Ready", "kubernetes.io/hostname": NODE})
    configmap = FakeNodeConfigMap({REF.configmap_key: '{"status": "Ready"}'})
    events = FakeEvents()
    metrics = Metrics()
    trash = Trash(layout)
    cached: list[dict[str, Any]] = []
    repaired: list[dict[str, Any]] = []
    ctx = RemovalContext(
        client=client,  # type: ignore[arg-type]
        node_name=NODE,
        layout=layout,
        manifests=manifests,
        trash=trash,
        labels=labels,  # type: ignore[arg-type]
        configmap=configmap,  # type: ignore[arg-type]
        fetcher=fetcher,
        events=events,  # type: ignore[arg-type]
        metrics=metrics,
        breaker=Breaker(settle_s=0),
        cached_models=lambda: list(cached),
        confirm_deadline_s=1.0,
    )
    ctx.repair_cache = lambda live, _read_at: repaired.append(live)
    env = Env(
        client=client,
        layout=layout,
        manifests=manifests,
        trash=trash,
        fetcher=fetcher,
        metrics=metrics,
        labels=labels,
        configmap=configmap,
        events=events,
        ctx=ctx,
        remover=Remover(ctx),
        dest=dest,
        manifest=manifest,
        cached=cached,
        repaired=repaired,
    )
    try:
        yield env
    finally:
        await asyncio.wait_for(fetcher.stop(), DEADLINE_S)


# ----------------------------------------------------------------------------------------- the rumour


async def test_alive_same_uid_touches_nothing(env: Env) -> None:
    live = env.live()
    env.client.script("GET", MODEL_PATH, live)
    env.client.script("GET", NODE_PATH, node())
    assert await env.remove() is False
    env.assert_untouched()
    assert env.confirmations(Outcome.ALIVE_SAME_UID) == 1
    assert env.confirmations(Outcome.CONFIRMED_GONE) == 0
    # The cached Node still selects it: only a "deselected" answer would need a live read of the Node.
    assert [(c.method, c.path) for c in env.client.calls] == [("GET", MODEL_PATH)]
    assert env.repaired == [live]  # the cache had lost it: the live read repairs it


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(status_error(503, "ServiceUnavailable"), id="503"),
        pytest.param(status_error(500, "InternalError"), id="500"),
        pytest.param(status_error(429, "TooManyRequests"), id="429"),
        pytest.param(status_error(403, "Forbidden"), id="403"),
        pytest.param(status_error(401, "Unauthorized"), id="401"),
        pytest.param(ApiUnavailable("connection refused"), id="unavailable"),
        pytest.param(type_not_found(), id="resource-type-gone"),
    ],
)
async def test_a_failed_read_raises_requeue_and_touches_nothing(env: Env, error: Exception) -> None:
    env.client.script("GET", MODEL_PATH, error)
    with pytest.raises(Requeue) as raised:
        await env.remove()
    assert raised.value.delay_s is None  # per-item exponential backoff
    env.assert_untouched()
    assert env.confirmations(Outcome.READ_FAILED) == 1
    assert env.client.calls_to("GET", NODE_PATH) == []


async def test_shutdown_during_the_confirmation_read_touches_nothing(env: Env) -> None:
    entered = asyncio.Event()
    never = asyncio.Event()

    async def hang() -> dict[str, Any]:
        entered.set()
        await never.wait()
        return not_found("m1", "clusterbasemodels").body

    env.client.script("GET", MODEL_PATH, hang)
    task = asyncio.get_running_loop().create_task(env.remover.remove(env.candidate()))
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)
    env.assert_untouched()


# --------------------------------------------------------------------------------------- confirmed gone


async def test_confirmed_gone_removes_everything_weights_to_the_trash(env: Env) -> None:
    staging = env.layout.primary.staging / token_for(REF.key)
    staging.mkdir(parents=True)
    (staging / "part.incomplete").write_bytes(b"x")
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)
    assert not staging.exists()
    assert env.confirmations(Outcome.CONFIRMED_GONE) == 1
    assert env.metrics.registry.get_sample_value("model_agent_quarantined_total") == 1
    removed = [e for e in env.events.emitted if e.reason == "Removed"]
    assert len(removed) == 1
    assert removed[0].type == "Normal"
    assert (removed[0].ref.kind, removed[0].ref.name, removed[0].ref.uid) == ("ClusterBaseModel", "m1", UID)
    assert env.client.calls_to("GET", NODE_PATH) == []


async def test_reserve_model_artifact_on_a_deleting_object_keeps_the_weights(env: Env) -> None:
    env.client.script("GET", MODEL_PATH, env.live(UID, deleting=True, labels={RESERVE_MODEL_ARTIFACT_LABEL: "True"}))
    assert await env.remove("deletionTimestamp set") is True
    env.assert_removed(weights_kept=True)
    assert env.confirmations(Outcome.DELETING) == 1
    assert "reserve-model-artifact" in next(e.message for e in env.events.emitted if e.reason == "Removed")


async def test_deleting_without_reserve_quarantines(env: Env) -> None:
    env.client.script("GET", MODEL_PATH, env.live(UID, deleting=True))
    assert await env.remove("deletionTimestamp set") is True
    env.assert_removed(weights_kept=False)


async def test_weights_another_live_model_uses_are_kept(env: Env) -> None:
    env.cached.append(env.live("uid-other", name="m1-alias", uri="hf://org/m1"))
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=True)
    assert "another live model uses this path" in next(e.message for e in env.events.emitted if e.reason == "Removed")


async def test_a_deleting_model_with_the_same_path_does_not_keep_the_weights(env: Env) -> None:
    env.cached.append(env.live("uid-other", name="m1-alias", deleting=True))
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)


# ------------------------------------------------------------------------------------------ recreated


async def test_recreated_with_the_same_source_and_path_is_adopted(env: Env) -> None:
    env.client.script("GET", MODEL_PATH, env.live(NEW_UID))
    env.client.script("GET", NODE_PATH, node())
    assert await env.remove() is False
    manifest = env.manifests.load(REF.key)
    assert manifest is not None
    assert manifest.uid == NEW_UID
    assert manifest.storage_uri == URI
    assert env.weights_in_place()
    assert env.trash_entries() == []
    assert env.labels.ensured == []
    assert env.configmap.ensured == []
    assert env.labels.values[REF.label_key] == "Ready"
    assert env.confirmations(Outcome.RECREATED_NEW_UID) == 1
    assert env.client.calls_to("GET", NODE_PATH) == []  # the cached Node selects it: nothing to confirm


async def test_recreated_same_source_but_not_selecting_this_node_is_removed(env: Env) -> None:
    env.client.script("GET", MODEL_PATH, env.live(NEW_UID, node_selector={"gpu": "a100"}))
    env.client.script("GET", NODE_PATH, node())
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)


async def test_recreated_with_another_source_quarantines_the_old_weights(env: Env) -> None:
    env.client.script("GET", MODEL_PATH, env.live(NEW_UID, uri="hf://org/m1-v2"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)
    assert env.confirmations(Outcome.RECREATED_NEW_UID) == 1
    assert env.client.calls_to("GET", NODE_PATH) == []


# ------------------------------------------------------------------------------------------ deselected


async def test_alive_but_no_longer_selecting_this_node_is_removed(env: Env) -> None:
    env.client.script("GET", MODEL_PATH, env.live(UID, node_selector={"gpu": "a100"}))
    env.client.script("GET", NODE_PATH, node())
    assert await env.remove("no longer selects this node") is True
    env.assert_removed(weights_kept=False)
    assert env.confirmations(Outcome.ALIVE_SAME_UID) == 1


async def test_a_failed_live_read_of_the_node_touches_nothing(env: Env) -> None:
    env.client.script("GET", MODEL_PATH, env.live(UID, node_selector={"gpu": "a100"}))
    env.client.script("GET", NODE_PATH, status_error(503, "ServiceUnavailable"))
    with pytest.raises(Requeue):
        await env.remove("no longer selects this node")
    env.assert_untouched()


# --------------------------------------------------------------------------------------------- breaker


async def test_breaker_settling_touches_nothing(env: Env) -> None:
    env.ctx.breaker = Breaker(settle_s=5.0)
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    with pytest.raises(Requeue) as raised:
        await env.remove()
    assert raised.value.delay_s == pytest.approx(5.0)
    env.assert_untouched()


async def test_breaker_held_touches_nothing_and_says_so(env: Env) -> None:
    env.ctx.breaker = Breaker(settle_s=0.0, minimum=1, ratio=0.0)
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    with pytest.raises(Requeue) as raised:
        await env.remove()
    assert raised.value.delay_s is not None
    assert raised.value.delay_s > 0
    env.assert_untouched()
    held = [e for e in env.events.emitted if e.reason == "RemovalHeld"]
    assert len(held) == 1
    assert held[0].type == "Warning"


# --------------------------------------------------------------------------------------------- fetcher


async def test_a_fetch_in_flight_is_cancelled_before_the_weights_move(env: Env) -> None:
    started = asyncio.Event()
    never = asyncio.Event()
    weights_there_when_cancelled: list[bool] = []

    async def download(job: Job) -> None:
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            weights_there_when_cancelled.append(env.dest.exists())
            raise

    assert await env.fetcher.submit(REF.key, f"{URI}|{env.dest}", download)
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    assert weights_there_when_cancelled == [True]
    assert env.fetcher.job(REF.key) is None
    env.assert_removed(weights_kept=False)


async def test_removal_completes_when_the_fetcher_is_already_stopped(env: Env) -> None:
    await asyncio.wait_for(env.fetcher.stop(), DEADLINE_S)
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)


async def test_weights_of_a_live_model_nested_inside_are_kept(env: Env) -> None:
    nested = env.dest / "adapters" / "lora"
    nested.mkdir(parents=True)
    (nested / "adapter.safetensors").write_bytes(b"lora weights")
    env.cached.append(env.live("uid-lora", name="m1-lora", uri="hf://org/m1-lora", path=str(nested)))
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    assert (nested / "adapter.safetensors").read_bytes() == b"lora weights"


async def test_weights_published_during_the_confirmation_read_are_not_orphaned(env: Env) -> None:
    # The first download is still running when the model is deleted: no manifest yet.
    env.manifests.delete(REF.key)
    for rel in WEIGHTS:
        (env.dest / rel).unlink()
    started = asyncio.Event()
    publish = asyncio.Event()

    async def download(job: Job) -> None:
        started.set()
        await publish.wait()
        for rel, data in WEIGHTS.items():
            (env.dest / rel).write_bytes(data)
        env.manifests.save(env.manifest, env.layout.primary)

    assert await env.fetcher.submit(REF.key, f"{URI}|{env.dest}", download)
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    candidate = Candidate(REF, UID, env.manifests.load(REF.key), "watch DELETED")
    assert candidate.manifest is None

    async def read_while_the_fetch_publishes() -> dict[str, Any]:
        publish.set()
        await asyncio.wait_for(_job_done(env.fetcher), DEADLINE_S)
        raise not_found("m1", "clusterbasemodels")

    env.client.script("GET", MODEL_PATH, read_while_the_fetch_publishes)
    assert await asyncio.wait_for(env.remover.remove(candidate), DEADLINE_S) is True
    tracked = env.manifests.load(REF.key) is not None or bool(env.trash_entries())
    assert tracked or not env.weights_in_place()


async def _job_done(fetcher: Fetcher) -> None:
    job = fetcher.job(REF.key)
    if job is not None:
        await asyncio.wait([job.task])


# ------------------------------------------------------------------------------ reserve-model-artifact


async def test_reserved_in_the_manifest_keeps_the_weights_after_a_plain_delete(env: Env) -> None:
    # A plain delete: the live read answers 404, nothing live carries the label; the manifest recorded it.
    env.manifest.reserved = True
    env.manifests.save(env.manifest, env.layout.primary)
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=True)
    assert "reserve-model-artifact" in next(e.message for e in env.events.emitted if e.reason == "Removed")


async def test_reserved_in_the_last_known_state_keeps_the_weights_after_a_plain_delete(env: Env) -> None:
    # The manifest predates the label (or is an old one without the field): the watch's last state has it.
    env.remover.note_last_state(REF.key, env.live(UID, labels={RESERVE_MODEL_ARTIFACT_LABEL: "TRUE"}))
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=True)


async def test_a_reserve_label_removed_before_the_delete_no_longer_reserves(env: Env) -> None:
    env.remover.note_last_state(REF.key, env.live(UID, labels={RESERVE_MODEL_ARTIFACT_LABEL: "true"}))
    env.remover.note_last_state(REF.key, env.live(UID))  # the label was taken off, then the object deleted
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)


async def test_a_successors_reserve_label_does_not_reserve_the_old_objects_weights(env: Env) -> None:
    env.remover.note_last_state(
        REF.key, env.live(NEW_UID, uri="hf://org/m1-v2", labels={RESERVE_MODEL_ARTIFACT_LABEL: "true"})
    )
    env.client.script(
        "GET", MODEL_PATH, env.live(NEW_UID, uri="hf://org/m1-v2", labels={RESERVE_MODEL_ARTIFACT_LABEL: "true"})
    )
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)


# ----------------------------------------------------------------------------------- order of the acts


async def test_label_then_entry_go_before_the_weights_move_and_the_manifest_goes_last(env: Env) -> None:
    seen: list[tuple[str, bool, str | None]] = []  # (write, weights in place, manifest's removing marker)
    label_ensure, entry_ensure = env.labels.ensure, env.configmap.ensure

    def marker() -> str | None:
        manifest = env.manifests.load(REF.key)
        return None if manifest is None else manifest.removing

    async def on_label(key: str, value: str | None) -> bool:
        seen.append(("label", env.weights_in_place(), marker()))
        return await label_ensure(key, value)

    async def on_entry(key: str, value: str | None) -> bool:
        seen.append(("entry", env.weights_in_place(), marker()))
        return await entry_ensure(key, value)

    env.labels.ensure = on_label  # type: ignore[method-assign]
    env.configmap.ensure = on_entry  # type: ignore[method-assign]
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    # The intent is on disk before anything is removed; the weights are still in place when label and entry go.
    assert seen == [("label", True, "watch DELETED"), ("entry", True, "watch DELETED")]
    env.assert_removed(weights_kept=False)


async def test_a_failing_label_write_leaves_the_weights_and_the_intent_and_counts_nothing(env: Env) -> None:
    async def refuse(key: str, value: str | None) -> bool:
        raise status_error(503, "ServiceUnavailable")

    label_ensure = env.labels.ensure
    env.labels.ensure = refuse  # type: ignore[method-assign]
    env.client.always("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    with pytest.raises(ApiError, match="503"):
        await env.remove()
    assert env.weights_in_place()
    assert env.trash_entries() == []
    manifest = env.manifests.load(REF.key)
    assert manifest is not None and manifest.removing == "watch DELETED"
    assert env.ctx.breaker.pending == [REF.key]  # decided, not done
    env.labels.ensure = label_ensure  # type: ignore[method-assign]
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)
    assert env.ctx.breaker.pending == []


def _more_manifests(env: Env, n: int) -> None:
    for i in range(n):
        env.manifests.save(
            Manifest(key=f"ClusterBaseModel//other-{i}", uid=f"o{i}", storage_uri=URI, dest=str(env.dest) + f"-{i}"),
            env.layout.primary,
        )


async def test_a_removal_the_trash_refuses_is_retried_without_tripping_the_breaker(env: Env) -> None:
    # A directory above the weights replaced by a symlink: the trash refuses to move through it, every time.
    models = env.dest.parent
    real = models.with_name("models-real")
    models.rename(real)
    models.symlink_to(real)
    _more_manifests(env, 3)  # four models on the node
    env.ctx.breaker = Breaker(settle_s=0.0, ratio=0.5, minimum=3)
    env.client.always("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    for _ in range(10):
        with pytest.raises(Requeue, match="trash"):
            await env.remove()
    assert not env.ctx.breaker.is_open
    assert env.ctx.breaker.trips == 0
    assert "RemovalHeld" not in env.events.reasons
    assert "RemovalFailed" in env.events.reasons
    # Label and entry are gone (nothing advertises the model); the weights and their record stay for the retry.
    assert REF.label_key not in env.labels.values
    assert REF.configmap_key not in env.configmap.values
    assert read_tree(real / "m1") == WEIGHTS
    assert env.trash_entries() == []
    manifest = env.manifests.load(REF.key)
    assert manifest is not None and manifest.removing
    # Once the path is sane again the removal completes, counted once.
    models.unlink()
    real.rename(models)
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)


async def test_a_removal_recorded_before_a_restart_completes_without_settling_again(env: Env) -> None:
    env.manifest.removing = "watch DELETED"
    env.manifests.save(env.manifest, env.layout.primary)
    env.labels.values.pop(REF.label_key)  # killed after the label went
    env.ctx.breaker = Breaker(settle_s=5.0)
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True  # confirmed again, then completed: no settle Requeue
    assert REF.configmap_key not in env.configmap.values
    assert env.manifests.load(REF.key) is None
    assert len(env.trash_entries()) == 1


async def test_a_recorded_removal_whose_object_is_alive_is_void(env: Env) -> None:
    env.manifest.removing = "no longer selects this node"
    env.manifests.save(env.manifest, env.layout.primary)
    env.client.script("GET", MODEL_PATH, env.live())
    assert await env.remove() is False
    manifest = env.manifests.load(REF.key)
    assert manifest is not None and manifest.removing == ""
    assert env.weights_in_place()


# --------------------------------------------------------------------- re-created after the confirmation


async def test_an_object_recreated_in_the_cache_after_the_confirming_read_stops_the_removal(env: Env) -> None:
    async def gone_then_recreated() -> dict[str, Any]:
        env.cached.append(env.live(NEW_UID, uri="hf://org/m1-v2"))  # the watch delivers the new object meanwhile
        raise not_found("m1", "clusterbasemodels")

    env.client.script("GET", MODEL_PATH, gone_then_recreated)
    with pytest.raises(Requeue, match="re-created"):
        await env.remove()
    env.assert_untouched()
    assert env.ctx.breaker.pending == []


async def test_a_successor_the_confirming_read_saw_does_not_stop_the_removal(env: Env) -> None:
    # The read itself returned the new UID (another source): the decision knew it, the cache agreeing is no news.
    successor = env.live(NEW_UID, uri="hf://org/m1-v2")
    env.cached.append(successor)
    env.client.script("GET", MODEL_PATH, successor)
    assert await env.remove() is True
    assert not env.dest.exists() and len(env.trash_entries()) == 1


async def test_a_deleting_object_in_the_cache_does_not_stop_the_removal(env: Env) -> None:
    env.cached.append(env.live(NEW_UID, deleting=True))
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    assert await env.remove() is True
    env.assert_removed(weights_kept=False)


# ------------------------------------------------------------------------------- superseded copies


NEW_TARGET = "hf://org/m1-v2|/elsewhere"


async def test_replace_superseded_settles_then_retires_and_counts_once(env: Env) -> None:
    env.ctx.breaker = Breaker(settle_s=5.0)
    env.client.always("GET", MODEL_PATH, env.live(uri="hf://org/m1-v2", path="/elsewhere"))
    with pytest.raises(Requeue) as raised:
        await env.remover.replace_superseded(REF, env.manifest, NEW_TARGET)
    assert raised.value.delay_s == pytest.approx(5.0)
    assert env.weights_in_place() and env.manifests.load(REF.key) is not None
    env.ctx.breaker = Breaker(settle_s=0.0)
    await env.remover.replace_superseded(REF, env.manifest, NEW_TARGET)
    assert not env.dest.exists()
    entries = list(env.trash.entries())
    assert len(entries) == 1 and read_tree(entries[0].data) == WEIGHTS
    assert env.manifests.load(REF.key) is None
    assert env.ctx.breaker.pending == []


async def test_replace_superseded_held_by_the_breaker_keeps_the_old_copy(env: Env) -> None:
    env.ctx.breaker = Breaker(settle_s=0.0, minimum=1, ratio=0.0)
    env.client.always("GET", MODEL_PATH, env.live(uri="hf://org/m1-v2", path="/elsewhere"))
    with pytest.raises(Requeue, match="breaker"):
        await env.remover.replace_superseded(REF, env.manifest, NEW_TARGET)
    assert env.weights_in_place()
    assert env.trash_entries() == []
    manifest = env.manifests.load(REF.key)
    assert manifest is not None and manifest.storage_uri == URI and manifest.removing == ""
    assert "RemovalHeld" in env.events.reasons


async def test_replace_superseded_many_switches_trip_the_breaker_before_anything_moves(env: Env) -> None:
    # A GitOps typo re-points most models at once: each retirement is pending together and the breaker opens.
    env.ctx.breaker = Breaker(settle_s=5.0, ratio=0.5, minimum=3)
    _more_manifests(env, 3)
    env.client.always("GET", MODEL_PATH, env.live(uri="hf://org/m1-v2", path="/elsewhere"))
    others = [Manifest(key=f"ClusterBaseModel//other-{i}", uid=f"o{i}", storage_uri=URI, dest="/x") for i in range(3)]
    for manifest in others:
        env.ctx.breaker.decide(f"{manifest.key}@{manifest.storage_uri}|{manifest.dest}", 4)
    with pytest.raises(Requeue, match="breaker"):
        await env.remover.replace_superseded(REF, env.manifest, NEW_TARGET)
    assert env.ctx.breaker.is_open
    assert env.weights_in_place()


async def test_replace_superseded_never_drops_the_new_copys_record(env: Env) -> None:
    env.ctx.breaker = Breaker(settle_s=0.0)
    env.client.always("GET", MODEL_PATH, env.live(uri="hf://org/m1-v2", path="/elsewhere"))
    new = Manifest(key=REF.key, uid=UID, storage_uri="hf://org/m1-v2", dest="/elsewhere", owned=False)
    env.manifests.save(new, env.layout.primary)  # the caller recorded the new copy first
    await env.remover.replace_superseded(REF, env.manifest, NEW_TARGET)
    assert not env.dest.exists()
    kept = env.manifests.load(REF.key)
    assert kept is not None and kept.storage_uri == "hf://org/m1-v2"


async def test_replace_superseded_the_trash_refuses_keeps_the_record_and_counts_nothing(env: Env) -> None:
    models = env.dest.parent
    real = models.with_name("models-real")
    models.rename(real)
    models.symlink_to(real)
    env.ctx.breaker = Breaker(settle_s=0.0)
    env.client.always("GET", MODEL_PATH, env.live(uri="hf://org/m1-v2", path="/elsewhere"))
    with pytest.raises(Requeue, match="trash"):
        await env.remover.replace_superseded(REF, env.manifest, NEW_TARGET)
    manifest = env.manifests.load(REF.key)
    assert manifest is not None and manifest.removing == "superseded by a new spec"
    assert read_tree(real / "m1") == WEIGHTS
    assert env.ctx.breaker.pending == [f"{REF.key}@{URI}|{env.dest}"]


# ------------------------------------------------------------------------ the records this path reads


def test_an_old_manifest_without_the_new_fields_loads_and_unknown_fields_are_ignored(env: Env) -> None:
    raw = json.loads(env.manifest.to_json())
    del raw["reserved"], raw["removing"]
    raw["from_a_newer_version"] = 1
    loaded = Manifest.from_json(json.dumps(raw))
    assert (loaded.reserved, loaded.removing, loaded.key) == (False, "", REF.key)


def test_the_manifest_count_follows_saves_and_deletes_without_reading_files(env: Env) -> None:
    assert env.manifests.count() == 1
    _more_manifests(env, 2)
    assert env.manifests.count() == 3
    env.manifests.save(env.manifest, env.layout.primary)  # saved again: still one model
    assert env.manifests.count() == 3
    env.manifests.delete(REF.key)
    env.manifests.delete(REF.key)
    assert env.manifests.count() == 2
    (env.layout.primary.manifests / "garbled.json").write_text("{")
    assert ManifestStore(env.layout).count() == 3  # a fresh store (a restart) reads the names from disk


@pytest.mark.parametrize("spelling", ["{d}", "{d}/", "{parent}//x", "{link}/x"])
def test_a_spec_naming_the_same_directory_differently_still_wants_it(tmp_path: Path, spelling: str) -> None:
    """A trailing '/', '//' or a symlinked root name the manifest's directory: the old copy is not retired."""
    from model_agent.agent.removal import _same_dir, _wants

    real = tmp_path / "models"
    (real / "x").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    dest = str(real / "x")
    raw = spelling.format(d=dest, parent=real, link=link)
    assert _same_dir({"path": raw}, dest)
    assert _wants({"spec": {"storage": {"storageUri": "hf://a/b", "path": raw}}}, "hf://a/b", dest)
    assert not _same_dir({"path": str(real / "y")}, dest)
    assert _same_dir({"storageUri": f"local://{dest}"}, dest)  # local:// without a path names the URI's


MANIFEST_DOC: dict[str, Any] = {
    "key": REF.key,
    "uid": UID,
    "storage_uri": URI,
    "dest": "/m",
    "files": [{"path": "a", "size": 1}],
}


@pytest.mark.parametrize(
    "text",
    [
        *NOT_OBJECTS,
        DEEP,
        json.dumps(MANIFEST_DOC | {"dest": []}),
        json.dumps(MANIFEST_DOC | {"key": None}),
        json.dumps(MANIFEST_DOC | {"generation": True}),
        json.dumps(MANIFEST_DOC | {"generation": 1.5}),
        json.dumps(MANIFEST_DOC | {"generation": 2**64}),
        json.dumps(MANIFEST_DOC | {"published_at": 10**400}),
        json.dumps(MANIFEST_DOC)[:-1] + ', "verified_at": 1e999}',  # inf
        json.dumps(MANIFEST_DOC | {"owned": 1}),
        json.dumps(MANIFEST_DOC | {"metadata": []}),
        json.dumps(MANIFEST_DOC | {"files": {}}),
        json.dumps(MANIFEST_DOC | {"files": ["a"]}),
        json.dumps(MANIFEST_DOC | {"files": [{"path": [], "size": 1}]}),
        json.dumps(MANIFEST_DOC | {"files": [{"path": "a", "size": "1"}]}),
        json.dumps(MANIFEST_DOC | {"files": [{"path": "a", "size": 1, "sha256": 5}]}),
    ],
    ids=[
        "list",
        "number",
        "string",
        "null",
        "deep",
        "dest a list",
        "key null",
        "generation a bool",
        "generation a float",
        "generation beyond int64",
        "published_at beyond float",
        "verified_at infinite",
        "owned a number",
        "metadata a list",
        "files an object",
        "a file a string",
        "a path a list",
        "a size a string",
        "a sha256 a number",
    ],
)
def test_a_manifest_of_the_wrong_shape_reads_as_absent_with_a_problem(tmp_path: Path, text: str) -> None:
    layout = Layout(tmp_path / "root")
    layout.ensure()
    path = layout.primary.manifests / f"{token_for(REF.key)}.json"
    path.write_text(text)
    store = ManifestStore(layout)
    assert store.load(REF.key) is None
    assert store.problems[str(path)].startswith("unreadable manifest")
    assert list(store.all()) == []


def test_fields_a_newer_version_adds_to_a_file_record_are_ignored() -> None:
    doc = MANIFEST_DOC | {"files": [{"path": "a", "size": 1, "from_a_newer_version": [1]}]}
    assert Manifest.from_json(json.dumps(doc)).files == [FileRecord("a", 1)]


@pytest.mark.parametrize("name", ["a\x00b", "\ud800"], ids=["NUL", "lone surrogate"])
def test_a_recorded_path_no_file_can_have_is_missing_to_the_fast_check(tmp_path: Path, name: str) -> None:
    manifest = Manifest(key=REF.key, uid=UID, storage_uri=URI, dest=str(tmp_path), files=[FileRecord(name, 1)])
    assert manifest.fast_check() == [f"{name}: missing"]
