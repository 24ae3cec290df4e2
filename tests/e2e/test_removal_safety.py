"""The one destructive path end to end: what a removal keeps, what it counts, and that a real one is never held.

Against the real API server, with the agent as a subprocess:

* a model carrying ``models.ome/reserve-model-artifact`` keeps its weights through a delete — a plain one
  (the live read answers 404, so only the watch's last state and the manifest still know the label) and one
  held by a finalizer — past the trash grace and a purge pass;
* a removal whose weights the trash refuses (a directory above them replaced by a symlink) is retried
  without ever counting toward the delete breaker, while the node's other removals proceed;
* three of seven models deleted at once, with the default settle and debounce, are removed promptly and
  never held: the breaker's share is taken against the seven the window started with;
* the agent SIGKILLed at each step of a removal (its label PATCH, then its entry PATCH, stalled at the fault
  proxy): at no observed instant is the label ``Ready`` while the weights are not at their path, and a restarted
  agent completes the recorded removal;
* a truncated label that no object, manifest or entry explains is left alone (no confirmation read of the name
  a truncation parses to), counted in ``model_agent_unresolved_keys`` and listed in ``/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from model_agent.kube.client import ApiError
from model_agent.kube.resources import CLUSTERBASEMODELS
from model_agent.local.layout import Layout
from model_agent.local.manifest import ManifestStore
from model_agent.model.keys import RESERVE_MODEL_ARTIFACT_LABEL, configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.proxies.faultproxy import FaultProxy, Rule, stall
from testbed.servers.olah import create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, LabelHistory, cbm
from tests.support.waiting import always, eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
MERGE_PATCH = "application/merge-patch+json"


# ----------------------------------------------------------------------------------------------- helpers


async def label_and_entry(kube: Kube, agent: AgentProcess, name: str) -> tuple[str | None, str | None]:
    labels = await kube.node_labels(agent.node)
    entry = await kube.entry(agent.node, configmap_key(CBM, "", name))
    return labels.get(node_label_key(CBM, "", name)), (entry or {}).get("status")


async def create_models(
    kube: Kube,
    agent: AgentProcess,
    mirrors_root: Path,
    names: list[str],
    *,
    dest_of: dict[str, Path] | None = None,
    labels: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    seed: int = 0,
) -> dict[str, tuple[Path, dict[str, bytes]]]:
    """Create an hf:// model per name (each its own repo on the local mirror) and wait until all are Ready."""
    made: dict[str, tuple[Path, dict[str, bytes]]] = {}
    for i, name in enumerate(names):
        files = tiny_llama(seed + i)
        repo = f"acme/{name}"
        await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
        dest = (dest_of or {}).get(name) or agent.models_root / name
        body = cbm(name, f"hf://{repo}", str(dest))
        if labels:
            body["metadata"]["labels"] = dict(labels)
        if finalizers:
            body["metadata"]["finalizers"] = list(finalizers)
        await kube.apply(body)
        made[name] = (dest, files)

    async def all_ready() -> bool:
        return all([await label_and_entry(kube, agent, n) == ("Ready", "Ready") for n in names])

    await eventually(all_ready, timeout=90, what=f"{len(names)} models Ready")
    return made


def weights_at(dest: Path, files: dict[str, bytes]) -> bool:
    return all((dest / rel).is_file() and (dest / rel).read_bytes() == data for rel, data in files.items())


def trash_list(agent: AgentProcess) -> list[dict[str, Any]]:
    """``model-agent trash list -o json`` for the agent's models root (what an operator would run)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_agent",
            "trash",
            "list",
            "--models-root-dir",
            str(agent.models_root),
            "-o",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    entries: list[dict[str, Any]] = json.loads(out)
    return entries


def trash_dir(agent: AgentProcess) -> Path:
    return agent.models_root / ".model-agent" / "trash"


def trash_ids(agent: AgentProcess) -> list[str]:
    directory = trash_dir(agent)
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


async def removal_held_events(kube: Kube, names: list[str]) -> list[dict[str, Any]]:
    held = []
    for name in names:
        held += [e for e in await kube.events_for(name) if e.get("reason") == "RemovalHeld"]
    return held


# -------------------------------------------------------------------------------- reserve-model-artifact


@pytest.mark.parametrize("finalizer", [False, True], ids=["plain-delete", "finalizer"])
async def test_reserved_model_deleted_keeps_weights(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str, finalizer: bool
) -> None:
    # A tiny grace: any trashed weights would be purged within a second or two.
    agent = await make_agent(args=("--trash-grace", "1"))
    reserved, control = f"reserved-{unique}", f"control-{unique}"
    made = await create_models(
        kube,
        agent,
        mirrors_root,
        [reserved],
        labels={RESERVE_MODEL_ARTIFACT_LABEL: "true"},
        finalizers=["example.com/hold"] if finalizer else None,
    )
    made |= await create_models(kube, agent, mirrors_root, [control], seed=7)
    dest, files = made[reserved]
    try:
        await _delete_reserved_then_purge_a_control(kube, agent, reserved, control, made, finalizer)
    finally:
        if finalizer:  # a failed test must not leave an undeletable object behind
            with contextlib.suppress(ApiError):
                await _drop_finalizers(kube, reserved)
    assert not made[control][0].exists()
    assert weights_at(dest, files), "the reserved model's weights must stay at their path"
    assert trash_list(agent) == []
    assert agent.metric("model_agent_quarantined_total") == 1  # the control model only
    removed = [e for e in await kube.events_for(reserved) if e.get("reason") == "Removed"]
    assert removed and "reserve-model-artifact" in removed[-1]["message"]


async def _drop_finalizers(kube: Kube, name: str) -> None:
    await kube.c.request(
        "PATCH", CLUSTERBASEMODELS.path(None, name), body={"metadata": {"finalizers": None}}, content_type=MERGE_PATCH
    )


async def _delete_reserved_then_purge_a_control(
    kube: Kube,
    agent: AgentProcess,
    reserved: str,
    control: str,
    made: dict[str, tuple[Path, dict[str, bytes]]],
    finalizer: bool,
) -> None:
    await kube.delete_model(CBM, reserved)

    async def reserved_removed() -> bool:
        return await label_and_entry(kube, agent, reserved) == (None, None)

    await eventually(reserved_removed, timeout=30, what="the reserved model's label and entry removed")
    if finalizer:
        # The removal happened while the object was still there (deleting); now let it go for good.
        await _drop_finalizers(kube, reserved)

        async def object_gone() -> bool:
            return await kube.model_gone(CBM, reserved)

        await eventually(object_gone, timeout=30, what="the object gone once its finalizer is removed")

    # The control model is not reserved: once its trashed weights are purged, a purge pass has run after the
    # reserved model's removal — had its weights gone to the trash, they would be gone now too.
    await kube.delete_model(CBM, control)

    async def control_purged() -> bool:
        removed = await label_and_entry(kube, agent, control) == (None, None)
        return removed and agent.metric("model_agent_purged_total") >= 1 and not trash_ids(agent)

    await eventually(control_purged, timeout=60, what="the control model trashed and purged")


# ------------------------------------------------------------------------- counted once it has happened


async def test_failing_removal_does_not_trip_breaker(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    # Eight models; four are deleted: 4 of 8 is not more than half, so a correct breaker stays closed. One of
    # the four cannot be moved to the trash, and is retried with backoff: counting each retry (as the breaker
    # did) would make it 5, 6, ... of 8 and trip it within seconds, holding every real removal.
    agent = await make_agent()
    names = [f"fleet-{unique}-{i}" for i in range(8)]
    failing, others = names[0], names[1:4]
    nested = agent.models_root / "nested"
    made = await create_models(kube, agent, mirrors_root, names, dest_of={failing: nested / failing}, seed=20)
    dest, files = made[failing]
    # A directory above the failing model's weights becomes a symlink (to its own old contents): the trash
    # refuses to rename through it, on every attempt.
    real = agent.models_root / "nested-real"
    nested.rename(real)
    nested.symlink_to(real)
    for name in [failing, *others]:
        await kube.delete_model(CBM, name)

    def refusals() -> int:
        return agent.log_text().count("weights could not be moved to the trash")

    opened: list[float] = []

    async def others_removed_failing_retried() -> bool:
        if agent.metric("model_agent_delete_breaker_open") != 0:
            opened.append(1.0)
            return True  # stop waiting: asserted below
        for name in others:
            if await label_and_entry(kube, agent, name) != (None, None) or made[name][0].exists():
                return False
        return refusals() >= 4

    await eventually(others_removed_failing_retried, timeout=60, what="three removals done, the fourth retried")
    assert opened == [], "the delete breaker opened"
    assert agent.metric("model_agent_delete_breaker_trips_total") == 0
    assert await removal_held_events(kube, names) == []
    # Nothing advertises the failing model any more; its weights are where they were, awaiting the retry.
    assert await label_and_entry(kube, agent, failing) == (None, None)
    assert weights_at(real / failing, files)
    for name in names[4:]:
        assert await label_and_entry(kube, agent, name) == ("Ready", "Ready")

    # The path made sane again: the retry completes the removal.
    nested.unlink()
    real.rename(nested)

    async def failing_trashed() -> bool:
        return not dest.exists() and any(e["key"] == f"{CBM}//{failing}" for e in trash_list(agent))

    await eventually(failing_trashed, timeout=120, what="the failing removal completed once the path is sane")
    assert agent.metric("model_agent_delete_breaker_trips_total") == 0


# --------------------------------------------------------------------- the share at the window's start


@pytest.mark.parametrize("run", range(5))
async def test_three_of_seven_deleted_never_held(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str, run: int
) -> None:
    # The defaults (the fixture lowers settle and debounce for speed): the removals confirm and settle at
    # slightly different times, so the first ones may act (and drop their manifests) while the last decides.
    await _three_of_seven(kube, mirrors_root, make_agent, f"{unique}-{run}", seed=40 + 10 * run, staggered=False)


async def test_three_of_seven_deleted_one_after_another_never_held(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    # The same share, made deterministic: the third delete comes once the first two are done, so only five
    # manifests are left when it is decided. 3 of 7 within the window is still under half.
    await _three_of_seven(kube, mirrors_root, make_agent, unique, seed=95, staggered=True)


async def _three_of_seven(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, tag: str, *, seed: int, staggered: bool
) -> None:
    agent = await make_agent(args=("--delete-settle", "5", "--confirm-debounce", "1.5"))
    names = [f"seven-{tag}-{i}" for i in range(7)]
    made = await create_models(kube, agent, mirrors_root, names, seed=seed)
    deleted = names[:3]
    loop = asyncio.get_running_loop()
    opened: list[float] = []

    async def removed(these: list[str], since: float) -> None:
        async def done() -> bool:
            if agent.metric("model_agent_delete_breaker_open") != 0:
                opened.append(loop.time() - since)
                return True  # stop waiting: asserted below
            return all([await label_and_entry(kube, agent, n) == (None, None) for n in these])

        await eventually(done, timeout=30, what=f"{len(these)} labels and entries removed")
        assert opened == [], f"the delete breaker opened {opened[0]:.1f}s after the deletes" if opened else ""
        took = loop.time() - since
        assert took < 15, f"removals took {took:.1f}s"

    if staggered:
        started = loop.time()
        await asyncio.gather(*(kube.delete_model(CBM, n) for n in deleted[:2]))
        await removed(deleted[:2], started)
        started = loop.time()
        await kube.delete_model(CBM, deleted[2])
        await removed(deleted[2:], started)
    else:
        started = loop.time()
        await asyncio.gather(*(kube.delete_model(CBM, n) for n in deleted))
        await removed(deleted, started)
    assert agent.metric("model_agent_delete_breaker_trips_total") == 0
    assert await removal_held_events(kube, deleted) == []
    for name in names[3:]:
        assert await label_and_entry(kube, agent, name) == ("Ready", "Ready")
        assert weights_at(*made[name])


# ------------------------------------------------------------------- killed at each step of a removal


class ReadyWithoutWeights:
    """Samples, until stopped, whether the label says ``Ready`` while the weights are not at their path.

    Each sample looks at the path first, then reads the label: with the removal order (label, entry, then the
    weights) a missing path followed by a ``Ready`` label means both held at the instant the path was looked
    at. The other order would report a false violation whenever the agent removed the label and moved the
    weights between the two reads.
    """

    def __init__(self, kube: Kube, agent: AgentProcess, name: str, dest: Path, files: dict[str, bytes]) -> None:
        self.kube, self.agent, self.name, self.dest, self.files = kube, agent, name, dest, files
        self.samples = 0
        self.violations: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        label_key = node_label_key(CBM, "", self.name)
        while not self._stop.is_set():
            present = weights_at(self.dest, self.files)
            label = (await self.kube.node_labels(self.agent.node)).get(label_key)
            self.samples += 1
            if label == "Ready" and not present:
                self.violations.append(f"sample {self.samples}: label Ready, weights not at {self.dest}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=0.02)  # the sampling period, not a sync point

    async def __aenter__(self) -> ReadyWithoutWeights:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


@pytest.mark.parametrize("step", ["label", "entry"])
async def test_kill_at_each_removal_step_never_leaves_ready_without_weights(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, proxy: FaultProxy, unique: str, step: str
) -> None:
    agent = await make_agent(via=proxy.kubeconfig)  # type: ignore[attr-defined]
    name = f"killed-{unique}"
    made = await create_models(kube, agent, mirrors_root, [name], seed=70)
    dest, files = made[name]
    written = (
        rf"^/api/v1/nodes/{agent.node}$" if step == "label" else rf"^/api/v1/namespaces/ome/configmaps/{agent.node}$"
    )
    async with (
        LabelHistory(kube, agent.node, node_label_key(CBM, "", name)) as history,
        ReadyWithoutWeights(kube, agent, name, dest, files) as sampler,
    ):
        # The removal's write of this step is held at the proxy (never forwarded): the agent is killed inside it.
        stalled = proxy.add_rule(Rule(path=written, method="PATCH", action=stall(None, then="drop"), name="removal"))
        await kube.delete_model(CBM, name)

        async def write_stalled() -> bool:
            return stalled.fired >= 1

        await eventually(write_stalled, timeout=30, what=f"the removal's {step} PATCH stalled at the proxy")
        agent.kill()
        proxy.clear_rules()
        # Killed at that step: the weights are still at their path and the manifest still records the intent.
        assert weights_at(dest, files), "the weights moved before the label and entry were gone"
        label, entry = await label_and_entry(kube, agent, name)
        assert (label, entry) == (("Ready", "Ready") if step == "label" else (None, "Ready"))
        assert trash_ids(agent) == []
        recorded = ManifestStore(Layout(agent.models_root)).load(f"{CBM}//{name}")
        assert recorded is not None and recorded.removing, "the removal's intent was not recorded before the label"

        agent.start()
        await asyncio.to_thread(agent.wait_ready)

        async def removal_completed() -> bool:
            gone = await label_and_entry(kube, agent, name) == (None, None) and not dest.exists()
            recorded = ManifestStore(Layout(agent.models_root)).load(f"{CBM}//{name}")
            return gone and recorded is None and bool(trash_ids(agent))

        await eventually(removal_completed, timeout=60, what="the recorded removal completed after the restart")
    assert [e["key"] for e in trash_list(agent)] == [f"{CBM}//{name}"]
    assert sampler.samples > 10, f"only {sampler.samples} samples"
    assert sampler.violations == []
    # The watch (from a label already Ready) saw it go once and for good: never Ready again, nothing else.
    assert history.values and history.values[-1] is None, history.values
    first_gone = history.values.index(None)
    assert set(history.values[:first_gone]) <= {"Ready"}, history.values
    assert set(history.values[first_gone:]) == {None}, history.values
    assert agent.metric("model_agent_quarantined_total") == 1


# ------------------------------------------------------------------ a truncated key of no known model


async def test_a_truncated_label_of_no_known_model_is_left_alone(
    kube: Kube, make_agent: AgentFactory, unique: str
) -> None:
    # A label whose name part is a truncation (hash8-tail) and that no object, manifest or entry explains: parsed
    # alone it names a model that never existed, whose 404 would "prove" it gone. It is left alone and counted.
    agent = await make_agent(args=("--resync-interval", "2"))
    label = node_label_key(CBM, "", f"never-existed-{unique}-" + "q" * 40)
    await kube.label_node(agent.node, {label: "Ready"})

    async def still_there() -> bool:
        return (await kube.node_labels(agent.node)).get(label) == "Ready"

    await always(still_there, duration=5, what="the label of no known model stays through resyncs")

    async def counted() -> bool:
        return agent.metric("model_agent_unresolved_keys", where="label") == 1

    await eventually(counted, timeout=30, what="the truncated label counted as unresolved")

    confirmations = {k: v for k, v in agent.metrics().items() if k.startswith("model_agent_delete_confirmations")}
    assert not any(confirmations.values()), confirmations
    status = json.loads(agent.http("/status")[1])
    assert [u["key"] for u in status["unresolved"]] == [label]
    await kube.label_node(agent.node, {label: None})
