"""A deterministic simulation of several nodes over one shared models root, checked after every step.

Role: the scenario tests name the interleavings someone thought of; this drives the real agent code through
sequences nobody wrote down, and checks the fleet's promises after each step. hypothesis's
:class:`~hypothesis.stateful.RuleBasedStateMachine` chooses the steps, shrinks a failing sequence to a short one and
prints it (with ``@reproduce_failure`` and the seed to replay it).

What is real: each node's :class:`~model_agent.agent.reconciler.Reconciler`,
:class:`~model_agent.agent.removal.Remover`, :class:`~model_agent.agent.shared_root.SharedRoots`,
:class:`~model_agent.local.manifest.ManifestStore`, :class:`~model_agent.local.trash.Trash`,
:class:`~model_agent.agent.fetcher.Fetcher`, the breaker, ``publish`` and the artifact code, over real
directories: each node has a private primary root of its own and the one shared root as an allowed root (so both
the mixed layout and the shared one are exercised), optionally a ``--state-dir`` of its own.
What is a fake, because the real thing cannot run in a unit test: the API server (:class:`SimApi`: model objects, the
Node, Leases; per node it can be cut off), the node's label and entry writers (they record what the node shows), and
the origin (:class:`SimSource`: a model's bytes are a function of its URI, so any file can be checked against the
source it claims). A *kill* cancels a node's work after a chosen number of event-loop turns and builds the node
anew from its disk and the API: everything a process keeps in memory is lost (a cancellation runs ``finally``
blocks, a SIGKILL would not: the Leases a killed holder leaves are the one difference, and they expire).

Invariants, after every step:

* **Ready resolves**: a node labelled ``Ready`` for a live model — the very object (UID) and spec it wrote the label
  for — finds, through ``spec.storage.path`` (links followed), every file of that spec's source with the source's
  bytes (a label a node wrote for an object since deleted is stale until that node hears of the delete: a label
  names a model, not an object, and no node can take another's label back);
* **one owner**: a record of a live model names that model's owner (no tenant record adopted from another owner's
  publication), and an intact record's directory holds only the files it records (nothing added by another owner);
* **no live bytes lost**: the trash never holds the only copy of a live model that some node labels Ready.

Bounded for CI (``SIM_EXAMPLES``, ``SIM_STEPS``); ``MODEL_AGENT_SIM_PROFILE=long`` runs the long profile locally.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from model_agent.agent.breaker import Breaker
from model_agent.agent.fetcher import Fetcher
from model_agent.agent.ownership import owner_of_model
from model_agent.agent.reconciler import Context, Reconciler
from model_agent.agent.removal import RemovalContext, Remover
from model_agent.agent.requeue import Requeue
from model_agent.agent.shared_root import SharedRoots
from model_agent.kube.client import ApiError, ApiUnavailable
from model_agent.local.layout import Layout
from model_agent.local.manifest import FileRecord, ManifestStore
from model_agent.local.node_markers import write_marker
from model_agent.local.trash import Trash
from model_agent.local.verify import mark_damaged, verify_manifest
from model_agent.model.resources import ModelObject, ModelRef
from model_agent.model.uris import StorageType
from model_agent.ops.metrics import Metrics
from model_agent.sources.base import FetchRequest, FetchResult, SourceRules
from tests.unit.test_shared_root import LeaseApi

NODES = ("n1", "n2", "n3")
SOURCES = ("s3://bkt/alpha", "s3://bkt/beta", f"hf://org/alpha@{'a' * 40}", f"hf://org/beta@{'b' * 40}")
KEYS = ("ClusterBaseModel//a", "ClusterBaseModel//b", "BaseModel/team/t")
PATHS = ("m1", "m2")
FILES = ("config.json", "w.bin")

LONG = os.environ.get("MODEL_AGENT_SIM_PROFILE") == "long"
SIM_EXAMPLES = 400 if LONG else 40
SIM_STEPS = 60 if LONG else 25
QUIET_S = 10.0  # every step has this deadline: a step that cannot end is a failure, not a hang
JOB_WAIT_TURNS = 400  # how many event-loop turns a settling node waits for its fetch jobs in one round


def content(uri: str, path: str) -> bytes:
    """The origin's bytes of one file of a source: any file on disk can be traced to the source it came from."""
    return hashlib.sha256(f"{uri}|{path}".encode()).digest() * 8


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """The event loop's default executor in the simulation: "thread" work runs at once, on the loop.

    Real threads would make the interleavings depend on the OS scheduler, and a failing sequence could not be
    replayed. Inline, every interleaving is one of the event loop's, chosen by the steps: the same seed gives the
    same run. (Each call still ends before the next await, as the agent's own thread work does for its caller.)
    """

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a thread's would be
            future.set_exception(exc)
        return future


class SimSource:
    """The origin (a fake: a source whose files are a function of the URI), staging every file on each fetch."""

    rules = SourceRules()

    async def fetch(self, request: FetchRequest) -> FetchResult:
        request.staging.mkdir(parents=True, exist_ok=True)
        records = []
        for name in FILES:
            data = content(request.storage_uri, name)
            (request.staging / name).write_bytes(data)
            records.append(FileRecord(name, len(data), hashlib.sha256(data).hexdigest()))
        await asyncio.sleep(0)
        return FetchResult(revision="r1", files=records, staged=list(FILES))


class SimApi(LeaseApi):
    """The API server (a fake): model objects by key, one Node per node name, Leases; a node can be cut off."""

    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, dict[str, Any]] = {}
        self.cut_off: set[str] = set()
        self.uids = 0

    def view(self, node: str) -> NodeApi:
        return NodeApi(self, node)

    def object_path(self, key: str) -> str:
        ref = ModelRef.from_key(key)
        if ref.namespace:
            return f"/apis/ome.io/v1beta1/namespaces/{ref.namespace}/basemodels/{ref.name}"
        return f"/apis/ome.io/v1beta1/clusterbasemodels/{ref.name}"


class NodeApi:
    """One node's client of :class:`SimApi`."""

    def __init__(self, api: SimApi, node: str) -> None:
        self.api, self.node = api, node

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        await asyncio.sleep(0)
        if self.node in self.api.cut_off:
            raise ApiUnavailable(f"{self.node} is cut off from the API server")
        if path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"node": name}}}
        if path.startswith("/apis/ome.io/"):
            for key, obj in self.api.models.items():
                if self.api.object_path(key) == path:
                    if method == "GET":
                        return json.loads(json.dumps(obj))
                    return obj  # (a PATCH of enrichment: ignored)
            raise ApiError(404, {"reason": "NotFound", "details": {"name": path.rsplit("/", 1)[1]}}, method, path)
        return await self.api.request(method, path, body, **kw)


class Shown:
    """A node's labels and ConfigMap entries (what it tells the cluster); ``base``: the Node's own labels."""

    def __init__(self, base: dict[str, str] | None = None) -> None:
        self.values: dict[str, str] = {}
        self.base = base or {}
        self.on_ready: Any = lambda _label_key: None  # told of every Ready written, when it is written
        self.on_ready_begun: Any = lambda _label_key: None  # told of every Ready write when it is sent

    def labels(self) -> dict[str, str]:
        return {**self.base, **self.values}

    def model_labels(self) -> dict[str, str]:
        return dict(self.values)

    def data(self) -> dict[str, str]:
        return dict(self.values)

    async def ensure(self, key: str, value: str | None) -> bool:
        if value == "Ready":
            self.on_ready_begun(key)
        await asyncio.sleep(0)
        if value is None:
            return self.values.pop(key, None) is not None
        self.values[key] = value
        if value == "Ready":
            self.on_ready(key)
        return True


class _Events:
    def emit(self, ref: object, type_: str, reason: str, message: str) -> None:
        pass


@dataclass
class SimNode:
    """One node's agent: rebuilt from its disk and the API after a kill (labels and entries live in the API)."""

    name: str
    api: SimApi
    private_root: Path
    shared_root: Path
    state_dir: Path | None
    labels: Shown = field(default_factory=Shown)
    entries: Shown = field(default_factory=Shown)
    ready_spec: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # key -> (uid, uri, path) labelled
    requeued: set[str] = field(default_factory=set)
    ready_for_gone: list[str] = field(default_factory=list)  # Ready writes sent while the object was deleting or gone

    def __post_init__(self) -> None:
        self.labels.base = {"node": self.name}
        self.labels.on_ready = self._labelled_ready
        self.labels.on_ready_begun = self._ready_sent
        self.start()

    def _ready_sent(self, label_key: str) -> None:
        """A Ready label write is sent: the object it names must be there and not being deleted at this instant."""
        for key in KEYS:
            if ModelRef.from_key(key).label_key != label_key:
                continue
            live = self.api.models.get(key)
            if live is None or live["metadata"].get("deletionTimestamp"):
                self.ready_for_gone.append(f"{key} ({'deleting' if live else 'gone'})")

    def _labelled_ready(self, label_key: str) -> None:
        """Remember the spec a Ready label was written for (the object the reconciler saw in its cache then)."""
        for key in KEYS:
            live = self.api.models.get(key)
            if ModelRef.from_key(key).label_key == label_key and live is not None:
                storage = live["spec"]["storage"]
                self.ready_spec[key] = (live["metadata"]["uid"], storage["storageUri"], storage["path"])

    def start(self) -> None:
        client = self.api.view(self.name)
        self.layout = Layout(self.private_root, [self.shared_root], state_dir=self.state_dir)
        self.layout.ensure()
        self.manifests = ManifestStore(self.layout)
        self.shared = SharedRoots(client, "ome", self.name, self.layout, self.manifests, lease_s=30, poll_s=0.0)  # type: ignore[arg-type]
        self.shared.mark()
        self.fetcher = Fetcher(workers=2, on_done=self.requeued.add)
        trash = Trash(self.layout)
        stores = {"ClusterBaseModel": _Store(self.api, False), "BaseModel": _Store(self.api, True)}
        metrics = Metrics()
        # The node's parts (NodeParts), the same for the remover and the reconciler.
        parts: dict[str, Any] = {
            "client": client,
            "node_name": self.name,
            "layout": self.layout,
            "manifests": self.manifests,
            "trash": trash,
            "labels": self.labels,
            "configmap": self.entries,
            "fetcher": self.fetcher,
            "events": _Events(),
            "metrics": metrics,
        }
        self.remover = Remover(
            RemovalContext(
                **parts,
                breaker=Breaker(settle_s=0, minimum=10**6),
                cached_models=lambda: list(self.api.models.values()),
                confirm_deadline_s=1.0,
                shared_roots=self.shared,
            )
        )
        self.reconciler = Reconciler(
            Context(
                **parts,
                namespace="ome",
                remover=self.remover,
                hf=SimSource(),  # type: ignore[arg-type]
                models_store=stores,
                requeue_after=lambda key, _delay: self.requeued.add(key),
                sources={StorageType.S3: SimSource()},
                shared_roots=self.shared,
            )
        )

    async def stop(self) -> None:
        await asyncio.wait_for(self.fetcher.stop(), QUIET_S)

    async def reconcile(self, key: str) -> None:
        try:
            await self.reconciler.reconcile(key)
        except Requeue:
            self.requeued.add(key)
        except (ApiError, ApiUnavailable):
            self.requeued.add(key)


class _Store:
    """The node's informer cache of one kind: the API's current objects (this simulation's watch never lags)."""

    def __init__(self, api: SimApi, namespaced: bool) -> None:
        self.api, self.namespaced = api, namespaced

    def get(self, store_key: str) -> dict[str, Any] | None:
        for key, obj in self.api.models.items():
            ref = ModelRef.from_key(key)
            if (
                bool(ref.namespace) == self.namespaced
                and (f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name) == store_key
            ):
                return obj
        return None

    def values(self) -> list[dict[str, Any]]:
        return [o for k, o in self.api.models.items() if bool(ModelRef.from_key(k).namespace) == self.namespaced]


def model_object(key: str, uid: str, uri: str, path: str, nodes: frozenset[str], reuse: bool = False) -> dict[str, Any]:
    ref = ModelRef.from_key(key)
    meta: dict[str, Any] = {"name": ref.name, "uid": uid, "resourceVersion": "1", "generation": 1}
    meta["creationTimestamp"] = f"2026-01-01T00:00:{int(uid.split('-')[1]) % 60:02d}Z"
    if ref.namespace:
        meta["namespace"] = ref.namespace
    selector = {"node": next(iter(sorted(nodes)))} if len(nodes) == 1 else {}
    storage: dict[str, Any] = {"storageUri": uri, "path": path}
    if reuse:
        storage["downloadPolicy"] = "ReuseIfExists"  # (only a ClusterBaseModel of a pinned hf:// commit shares)
    if selector:
        storage["nodeSelector"] = selector
    elif len(nodes) < len(NODES):
        storage["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "node", "operator": "In", "values": sorted(nodes)}]}
                ]
            }
        }
    return {"apiVersion": "ome.io/v1beta1", "kind": ref.kind.value, "metadata": meta, "spec": {"storage": storage}}


class FleetSimulation(RuleBasedStateMachine):
    """Nodes over one shared root, driven through random sequences; the invariants are checked after each step."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(InlineExecutor())
        self.tmp = Path(tempfile.mkdtemp(prefix="fleet-sim-"))
        self.api = SimApi()
        self.nodes: dict[str, SimNode] = {}
        self.rotted: set[Path] = set()  # files that rotted in place and that no refetch has replaced yet

    @initialize(count=st.integers(min_value=2, max_value=3), state_dirs=st.booleans())
    def start_nodes(self, count: int, state_dirs: bool) -> None:
        shared = self.tmp / "shared"
        shared.mkdir()
        for name in NODES[:count]:
            private = self.tmp / f"local-{name}"
            state = self.tmp / f"state-{name}" if state_dirs else None
            self.nodes[name] = SimNode(name, self.api, private, shared, state)
        for node in self.nodes.values():  # every node has seen the others' markers
            write_marker(node.layout.roots[1].private, node.name)
            node.shared.mark()

    def teardown(self) -> None:
        try:
            for node in self.nodes.values():
                self.loop.run_until_complete(node.stop())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ----------------------------------------------------------------------------------------- steps

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, QUIET_S))

    def _path(self, path: str) -> str:
        return str(self.tmp / "shared" / path)

    @rule(
        key=st.sampled_from(KEYS),
        uri=st.sampled_from(SOURCES),
        path=st.sampled_from(PATHS),
        reuse=st.booleans(),
        nodes=st.data(),
    )
    def create(self, key: str, uri: str, path: str, reuse: bool, nodes: st.DataObject) -> None:
        if key in self.api.models:
            return
        chosen = nodes.draw(st.frozensets(st.sampled_from(sorted(self.nodes)), min_size=1))
        self.api.uids += 1
        self.api.models[key] = model_object(key, f"uid-{self.api.uids}", uri, self._path(path), chosen, reuse)

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        self.api.models.pop(key, None)

    @rule(
        node=st.sampled_from(NODES),
        key=st.sampled_from(KEYS),
        turns=st.integers(min_value=0, max_value=80),
        finalizer=st.booleans(),
    )
    def delete_mid_pass(self, node: str, key: str, turns: int, finalizer: bool) -> None:
        """A model's deletion begins ``turns`` event-loop turns into a node's pass (its ``deletionTimestamp`` set
        while a finalizer holds it, or the object simply gone), and the pass goes on; a held object goes after."""
        sim = self.nodes.get(node)
        if sim is None or key not in self.api.models:
            return

        async def run() -> None:
            task = asyncio.ensure_future(self._settle(sim))
            for _ in range(turns):
                if task.done():
                    break
                await asyncio.sleep(0)
            if finalizer:
                self.api.models[key]["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
            else:
                self.api.models.pop(key, None)
            await task

        self._run(run())
        self.api.models.pop(key, None)

    @rule(key=st.sampled_from(KEYS), nodes=st.data())
    def select(self, key: str, nodes: st.DataObject) -> None:
        obj = self.api.models.get(key)
        if obj is None:
            return
        chosen = nodes.draw(st.frozensets(st.sampled_from(sorted(self.nodes)), min_size=1))
        storage = obj["spec"]["storage"]
        reuse = storage.get("downloadPolicy") == "ReuseIfExists"
        fresh = model_object(key, obj["metadata"]["uid"], storage["storageUri"], storage["path"], chosen, reuse)
        self.api.models[key] = fresh

    @rule(node=st.sampled_from(NODES))
    def reconcile(self, node: str) -> None:
        if node not in self.nodes:
            return
        self._run(self._settle(self.nodes[node]))

    @rule(node=st.sampled_from(NODES), turns=st.integers(min_value=0, max_value=60))
    def kill(self, node: str, turns: int) -> None:
        """The node's agent dies ``turns`` event-loop turns into a pass, and starts again from disk and the API."""
        sim = self.nodes.get(node)
        if sim is None:
            return

        async def die() -> None:
            task = asyncio.ensure_future(self._settle(sim))
            for _ in range(turns):
                if task.done():
                    break
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await sim.stop()

        self._run(die())
        sim.requeued.clear()
        sim.start()

    @rule(first=st.sampled_from(NODES), second=st.sampled_from(NODES), turns=st.integers(min_value=0, max_value=80))
    def interleave(self, first: str, second: str, turns: int) -> None:
        """Two nodes act at once: ``first`` runs ``turns`` event-loop turns into its pass, then ``second`` runs a
        whole pass, then ``first`` goes on (each await of ``first`` is a point where another node may act)."""
        a, b = self.nodes.get(first), self.nodes.get(second)
        if a is None or b is None or a is b:
            return

        async def both() -> None:
            task = asyncio.ensure_future(self._settle(a))
            for _ in range(turns):
                if task.done():
                    break
                await asyncio.sleep(0)
            await self._settle(b)
            await task

        self._run(both())

    @rule(node=st.sampled_from(NODES), pick=st.integers(min_value=0, max_value=7))
    def bit_rot(self, node: str, pick: int) -> None:
        """A file of a model this node serves Ready rots in place (same size, same mtime); the node's verify pass
        finds it (marks the record, as maintenance does) and the node settles: it must repair, not re-adopt."""
        sim = self.nodes.get(node)
        if sim is None or node in self.api.cut_off:
            return
        ready = [
            m
            for m in sim.manifests.all()
            if sim.labels.values.get(ModelRef.from_key(m.key).label_key) == "Ready" and not m.fast_check() and m.files
        ]
        if not ready:
            return
        manifest = ready[pick % len(ready)]
        target = Path(manifest.dest) / manifest.files[pick % len(manifest.files)].path
        stat = target.stat()
        data = bytearray(target.read_bytes())
        data[0] ^= 0xFF
        target.write_bytes(bytes(data))
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        self.rotted.add(Path(os.path.realpath(target)))
        damaged = verify_manifest(manifest)
        current = sim.manifests.load(manifest.key)
        if damaged and current is not None and current.storage_uri == manifest.storage_uri:
            sim.manifests.save(mark_damaged(current, damaged), sim.layout.record_root(Path(current.dest)))
        self._run(self._settle(sim))
        self._run(self._settle(sim))
        if sim.labels.values.get(ModelRef.from_key(manifest.key).label_key) == "Ready":
            live = self.api.models.get(manifest.key)
            if live is not None and live["spec"]["storage"]["storageUri"] == manifest.storage_uri:
                assert target.is_file(), f"{node} Ready for {manifest.key} but {target} is missing"
                assert target.read_bytes() == content(manifest.storage_uri, target.name), (
                    f"{node} verified {target} damaged, and is Ready again with the damaged bytes"
                )
        gone = not target.is_file()
        if gone or target.read_bytes() == content(manifest.storage_uri, target.name):  # repaired, or gone
            self.rotted.discard(Path(os.path.realpath(target)))

    @rule(node=st.sampled_from(NODES), cut=st.booleans())
    def partition(self, node: str, cut: bool) -> None:
        (self.api.cut_off.add if cut else self.api.cut_off.discard)(node)

    async def _settle(self, sim: SimNode) -> None:
        """Reconcile every key until the node has nothing left to do (jobs finished, no requeue), or a few rounds
        have passed: a job may wait on another node or on an API it is cut off from, and the next steps go on
        while it waits (it runs beside them, as on a real node)."""
        for _ in range(4):
            sim.requeued.clear()
            for key in KEYS:
                await sim.reconcile(key)
            for _ in range(JOB_WAIT_TURNS):  # counted in event-loop turns, not time: replayable
                if not any(True for _ in sim.fetcher.jobs()):
                    break
                await asyncio.sleep(0)
            if not sim.requeued:
                return

    # ----------------------------------------------------------------------------------------- invariants

    @invariant()
    def ready_resolves_to_its_own_sources_files(self) -> None:
        for sim in self.nodes.values():
            for key, live in self.api.models.items():
                label = sim.labels.values.get(ModelRef.from_key(key).label_key)
                storage = live["spec"]["storage"]
                spec = (live["metadata"]["uid"], storage["storageUri"], storage["path"])
                if label != "Ready" or sim.ready_spec.get(key) != spec:
                    continue
                for name in FILES:
                    where = Path(storage["path"]) / name
                    assert where.is_file(), f"{sim.name} Ready for {key} but {where} is missing"
                    if Path(os.path.realpath(where)) in self.rotted:
                        continue  # rot no node has verified yet: a node that did is checked in bit_rot
                    assert where.read_bytes() == content(storage["storageUri"], name), (
                        f"{sim.name} Ready for {key} ({storage['storageUri']}) but {where} holds other bytes"
                    )

    @invariant()
    def no_ready_is_sent_for_an_object_being_deleted_or_gone(self) -> None:
        for sim in self.nodes.values():
            assert not sim.ready_for_gone, f"{sim.name} sent Ready for {sim.ready_for_gone}"

    @invariant()
    def records_name_their_owner_and_directories_hold_only_their_files(self) -> None:
        for sim in self.nodes.values():
            for manifest in sim.manifests.all():
                live = self.api.models.get(manifest.key)
                if live is None or live["metadata"]["uid"] != manifest.uid or not manifest.owner:
                    continue
                ref = ModelRef.from_key(manifest.key)
                owner = owner_of_model(ModelObject.from_dict(ref.kind.value, live)).fingerprint
                assert manifest.owner == owner, f"{manifest.key} records another owner's copy"
                if manifest.fast_check() or not Path(manifest.dest).is_dir():
                    continue
                there = {p.name for p in Path(manifest.dest).iterdir()}
                assert there == {f.path for f in manifest.files}, f"{manifest.dest} holds {there}"


FleetSimulation.TestCase.settings = settings(
    max_examples=SIM_EXAMPLES,
    stateful_step_count=SIM_STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=not LONG,
    print_blob=True,
)
test_fleet_simulation = FleetSimulation.TestCase
