"""A removal that arrives while a fetch is publishing: the fetch's thread work ends first, nothing is orphaned.

Real: the reconciler's fetch body (``Reconciler._fetch``), the shared publish step, the fetcher pool, the
Remover, the layout, manifests and trash (in ``tmp_path``). Fakes: the API client (scripted answers), a
source that stages two files, and small recorders for the node labels, the ConfigMap and Events. The
metadata parse is the only thing replaced: it blocks on a ``threading.Event`` (a slow disk, a huge
``config.json``) so the removal lands between publish and the manifest save. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.breaker import Breaker
from model_agent.agent.fetcher import Fetcher
from model_agent.agent.reconciler import Context, Reconciler, Target
from model_agent.agent.removal import Candidate, RemovalContext, Remover
from model_agent.local.layout import Layout, token_for
from model_agent.local.manifest import FileRecord, ManifestStore
from model_agent.local.trash import Trash
from model_agent.model.resources import ModelKind, ModelObject, ModelRef
from model_agent.model.uris import StorageType
from model_agent.ops.events import ObjectRef
from model_agent.ops.metrics import Metrics
from model_agent.sources.base import FetchRequest, FetchResult, SourceRules
from tests.support.fake_kube import FakeKubeClient, not_found
from tests.support.waiting import until

DEADLINE_S = 5.0
NODE = "node-1"
REF = ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", "m1")
MODEL_PATH = "/apis/ome.io/v1beta1/clusterbasemodels/m1"
UID = "uid-1"
URI = "s3://bucket/m1"
WEIGHTS = {"config.json": b'{"model_type": "llama"}', "model.safetensors": bytes(range(256)) * 16}


class Recorder:
    """A fake of NodeLabels and NodeConfigMap alike: values in memory, every ``ensure`` applied."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def labels(self) -> dict[str, str]:
        return {"kubernetes.io/hostname": NODE, **self.values}

    def model_labels(self) -> dict[str, str]:
        return dict(self.values)

    def data(self) -> dict[str, str]:
        return dict(self.values)

    async def ensure(self, key: str, value: str | None) -> bool:
        if value is None:
            return self.values.pop(key, None) is not None
        self.values[key] = value
        return True


class Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.reasons.append(reason)


class StagingSource:
    """A source that stages the weights into ``request.staging`` as a real download would."""

    rules = SourceRules()

    async def fetch(self, request: FetchRequest) -> FetchResult:
        request.staging.mkdir(parents=True, exist_ok=True)
        for rel, data in WEIGHTS.items():
            (request.staging / rel).write_bytes(data)
        files = [FileRecord(rel, len(data)) for rel, data in WEIGHTS.items()]
        return FetchResult(revision="rev-1", files=files, staged=list(WEIGHTS))


@dataclass
class Env:
    layout: Layout
    manifests: ManifestStore
    trash: Trash
    fetcher: Fetcher
    client: FakeKubeClient
    remover: Remover
    reconciler: Reconciler
    dest: Path
    raw: dict[str, Any]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    layout = Layout(tmp_path / "root")
    layout.ensure()
    dest = layout.primary.path / "models" / "m1"
    manifests = ManifestStore(layout)
    trash = Trash(layout)
    client = FakeKubeClient()
    fetcher = Fetcher(workers=1, on_done=lambda _key: None)
    labels, configmap, events, metrics = Recorder(), Recorder(), Events(), Metrics()
    raw = {
        "apiVersion": "ome.io/v1beta1",
        "kind": "ClusterBaseModel",
        "metadata": {"name": "m1", "uid": UID, "resourceVersion": "5", "generation": 1},
        "spec": {"storage": {"storageUri": URI, "path": str(dest)}},
    }
    remover = Remover(
        RemovalContext(
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
            cached_models=lambda: [],  # the object is gone from the cache
            confirm_deadline_s=1.0,
        )
    )
    ctx = Context(
        client=client,  # type: ignore[arg-type]
        node_name=NODE,
        namespace="ome",
        layout=layout,
        manifests=manifests,
        trash=trash,
        labels=labels,  # type: ignore[arg-type]
        configmap=configmap,  # type: ignore[arg-type]
        fetcher=fetcher,
        events=events,  # type: ignore[arg-type]
        metrics=metrics,
        remover=remover,
        hf=None,  # type: ignore[arg-type]
        models_store={ModelKind.CLUSTER_BASE_MODEL.value: {"m1": raw}, ModelKind.BASE_MODEL.value: {}},
        requeue_after=lambda _key, _delay: None,
        sources={StorageType.S3: StagingSource()},
    )
    try:
        yield Env(layout, manifests, trash, fetcher, client, remover, Reconciler(ctx), dest, raw)
    finally:
        await asyncio.wait_for(fetcher.stop(), DEADLINE_S)


def read_tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


async def test_a_removal_during_the_metadata_parse_quarantines_the_published_weights(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsing = threading.Event()
    release = threading.Event()

    def blocked_parse(obj: ModelObject, dest: Path, total: int) -> dict[str, Any] | None:
        parsing.set()
        release.wait(DEADLINE_S)  # a slow parse; bounded so a broken test cannot hang the run
        return None

    monkeypatch.setattr(env.reconciler, "_parse_metadata", blocked_parse)
    obj = ModelObject.from_dict(REF.kind, env.raw)
    target = Target(URI, env.dest, env.layout.primary, StorageType.S3)
    assert await env.fetcher.submit(REF.key, target.id, lambda job: env.reconciler._fetch(job, REF, obj, target, None))
    assert await asyncio.to_thread(parsing.wait, DEADLINE_S), "the fetch never reached the metadata parse"
    assert read_tree(env.dest) == WEIGHTS  # published, not yet recorded
    assert env.manifests.load(REF.key) is None

    # The model is deleted now: the removal is decided from a candidate without a manifest.
    del env.reconciler.ctx.models_store[ModelKind.CLUSTER_BASE_MODEL.value]["m1"]
    env.client.script("GET", MODEL_PATH, not_found("m1", "clusterbasemodels"))
    removal = asyncio.get_running_loop().create_task(env.remover.remove(Candidate(REF, UID, None, "watch DELETED")))
    job = env.fetcher.job(REF.key)
    assert job is not None
    await until(
        lambda: removal.done() or getattr(job, "cancel_requested", False),
        what="the removal to cancel the fetch",
        timeout=DEADLINE_S,
    )
    assert not removal.done(), "the removal went on while the fetch's thread was still parsing"
    assert env.dest.exists()

    release.set()
    assert await asyncio.wait_for(removal, DEADLINE_S) is True
    # The published weights were recorded, then found by the removal and quarantined: nothing unrecorded.
    assert not env.dest.exists()
    entries = list(env.trash.entries())
    assert [e.manifest.dest for e in entries] == [str(env.dest)]
    assert read_tree(entries[0].data) == WEIGHTS
    assert env.manifests.load(REF.key) is None
    assert not (env.layout.primary.staging / token_for(REF.key)).exists()
    assert env.fetcher.job(REF.key) is None
    assert list((env.layout.primary.path / "models").iterdir()) == []
