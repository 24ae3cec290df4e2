"""Late writes are fenced by UID (OME #680): a progress or state write of an object's earlier incarnation never
brings back what its removal took away, and never overwrites its successor's state — under random interleavings.

The node is the fleet simulation's (real reconciler, remover, fetcher, manifests and trash over real directories; the
API server and the label and entry writers are its fakes). A late writer sends ``Updating`` progress writes for the
first incarnation at random event-loop turns while that object is fetched, deleted, removed and (in half the runs)
created again under a new UID, as a download's progress task or a slow reconcile would.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from model_agent.model.resources import ModelObject, ModelRef
from model_agent.sources.base import Progress
from tests.support.waiting import until
from tests.unit.test_fleet_simulation import SOURCES, SimApi, SimNode, model_object

KEY = "ClusterBaseModel//a"


async def settle(node: SimNode) -> None:
    """Reconcile the key until nothing is requeued and no job runs (bounded: the jobs' thread work gets a deadline)."""
    for _ in range(8):
        node.requeued.clear()
        await node.reconcile(KEY)
        await until(lambda: not any(True for _ in node.fetcher.jobs()), what="the fetch job ended", timeout=10)
        if not node.requeued:
            return


@pytest.mark.parametrize("seed", range(24))
async def test_a_late_write_of_an_earlier_incarnation_is_dropped(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    recreate = seed % 2 == 1
    api = SimApi()
    node = SimNode("n1", api, tmp_path / "private", tmp_path / "shared", None)
    ref = ModelRef.from_key(KEY)
    dest = str(tmp_path / "private" / "m")
    api.models[KEY] = model_object(KEY, "uid-1", SOURCES[0], dest, frozenset({"n1"}))
    first = ModelObject.from_dict(ref.kind, api.models[KEY])
    lifecycle_done = asyncio.Event()

    async def late_writer() -> None:
        for _ in range(rng.randrange(2, 8)):
            for _ in range(rng.randrange(40)):
                await asyncio.sleep(0)
            progress = Progress(phase="downloading", total_bytes=10, completed_bytes=rng.randrange(10))
            await node.reconciler._write_progress(ref, first, progress, time.monotonic())
        await lifecycle_done.wait()
        await node.reconciler._write_progress(ref, first, Progress(phase="downloading"), time.monotonic())

    async def lifecycle() -> None:
        await settle(node)
        for _ in range(rng.randrange(30)):
            await asyncio.sleep(0)
        del api.models[KEY]
        await settle(node)
        if recreate:
            api.models[KEY] = model_object(KEY, "uid-2", SOURCES[1], dest, frozenset({"n1"}))
            await settle(node)
        lifecycle_done.set()

    await asyncio.wait_for(asyncio.gather(late_writer(), lifecycle()), 30)
    await node.stop()
    if recreate:
        assert node.labels.values.get(ref.label_key) == "Ready", (
            node.labels.values,
            node.entries.values,
            node.requeued,
            [m.uid for m in node.manifests.all()],
        )
        assert '"status":"Ready"' in node.entries.values.get(ref.configmap_key, "")
    else:
        assert ref.label_key not in node.labels.values
        assert ref.configmap_key not in node.entries.values
