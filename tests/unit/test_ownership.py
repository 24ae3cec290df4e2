"""Unit tests of the ownership decisions: one owner per directory tree, and trash restored only to its owner."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.fetcher import Fetcher
from model_agent.agent.ownership import (
    Claim,
    ClaimCache,
    ClaimIndex,
    Mode,
    Owner,
    Relation,
    claim_of,
    find_conflict,
    may_restore,
    normalise,
    restorable_by,
    restorable_to,
)
from model_agent.agent.reconciler import Context, Invalid, Reconciler
from model_agent.local.layout import Layout, PathRefused
from model_agent.local.manifest import FileRecord, Manifest, ManifestStore
from model_agent.local.trash import Trash
from model_agent.model.resources import ModelObject
from model_agent.model.uris import StorageType
from model_agent.ops.metrics import Metrics
from model_agent.sources.base import FetchRequest, FetchResult, SourceRules

URI = "hf://acme/llama"
VICTIM = Owner("team-a", URI)
ADMIN = Owner("", URI)


def claim(
    key: str, path: str | tuple[str, ...], *, owner: Owner = VICTIM, mode: Mode = Mode.WRITE, age: int = 0
) -> Claim:
    """A claim created ``age`` seconds after the epoch of these tests (lower is older)."""
    paths = (path,) if isinstance(path, str) else path
    return Claim(key, owner, paths, mode, f"2026-01-01T00:00:{age:02d}Z")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/m/llama", "/m/llama"),
        ("/m/llama/", "/m/llama"),
        ("/m//llama//", "/m/llama"),
        ("//m/llama", "/m/llama"),  # POSIX keeps a leading "//" in normpath; here it is one directory
        ("/", "/"),
        ("///", "/"),
        ("m/llama", None),
        ("", None),
        ("/m/../etc", None),
        ("/m/./llama", None),
    ],
)
def test_normalise(raw: str, expected: str | None) -> None:
    assert normalise(raw) == expected


EVIL = Owner("team-evil", URI)
EVIL_ENDPOINT = Owner("team-a", URI, parameters={"endpoint": "http://127.0.0.1:9/"})
EVIL_SECRET = Owner("team-a", URI, secret="mine")
EVIL_URI = Owner("team-a", "hf://acme/other")


@pytest.mark.parametrize(
    ("mine_path", "their_path", "owner", "relation"),
    [
        # overlaps of another owner: refused, named by the rule
        ("/m/llama", "/m/llama", EVIL, Relation.SAME),
        ("/m", "/m/llama", EVIL, Relation.CONTAINS),
        ("/m/llama/sub", "/m/llama", EVIL, Relation.INSIDE),
        ("/m/llama/a/b/c", "/m/llama", EVIL, Relation.INSIDE),
        ("/", "/m/llama", EVIL, Relation.CONTAINS),
        # the same URI and path is another owner when namespace, endpoint, Secret or URI differ
        ("/m/llama", "/m/llama", EVIL_ENDPOINT, Relation.SAME),
        ("/m/llama", "/m/llama", EVIL_SECRET, Relation.SAME),
        ("/m/llama", "/m/llama", EVIL_URI, Relation.SAME),
        ("/m/llama", "/m/llama", ADMIN, Relation.SAME),
        # no overlap
        ("/m/llama2", "/m/llama", EVIL, None),  # a prefix of the string is not a parent directory
        ("/m/llama", "/m/llama2", EVIL, None),
        ("/m/llama-b", "/m/llama", EVIL, None),
        ("/m/other", "/m/llama", EVIL, None),  # siblings
        ("/n/llama", "/m/llama", EVIL, None),
        # the same owner shares one directory, but never a parent or a child
        ("/m/llama", "/m/llama", VICTIM, None),
        ("/m/llama/sub", "/m/llama", VICTIM, Relation.INSIDE),
        ("/m", "/m/llama", VICTIM, Relation.CONTAINS),
    ],
)
def test_an_older_overlapping_claim_of_another_owner_blocks(
    mine_path: str, their_path: str, owner: Owner, relation: Relation | None
) -> None:
    victim = claim("BaseModel/team-a/victim", their_path, age=1)
    tenant = claim("BaseModel/x/tenant", mine_path, owner=owner, age=2)
    conflict = find_conflict(tenant, ClaimIndex([victim]))
    if relation is None:
        assert conflict is None
        return
    assert conflict is not None
    assert conflict.holder is victim and conflict.relation == relation
    assert "one owner per directory tree" in conflict.message
    assert "the directory that BaseModel/team-a/victim writes" in conflict.message
    assert f"{mine_path!r} {relation.value}" in conflict.message
    assert (f"{their_path!r}, the directory" in conflict.message) is (relation != Relation.SAME)


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        ("/m/llama/", "/m/llama"),
        ("/m/llama", "/m/llama/"),
        ("//m//llama", "/m/llama"),
    ],
)
def test_trailing_and_repeated_slashes_are_the_same_directory(mine: str, theirs: str) -> None:
    victim = claim("BaseModel/team-a/victim", normalise(theirs) or "", age=1)
    tenant = claim("BaseModel/team-evil/t", normalise(mine) or "", owner=EVIL, age=2)
    conflict = find_conflict(tenant, ClaimIndex([victim]))
    assert conflict is not None and conflict.relation == Relation.SAME


def test_the_older_model_keeps_the_directory() -> None:
    older = claim("BaseModel/team-evil/first", "/m/llama", owner=EVIL, age=1)
    newer = claim("BaseModel/team-a/second", "/m/llama/sub", age=2)
    index = ClaimIndex([older, newer])
    assert find_conflict(older, index) is None
    conflict = find_conflict(newer, index)
    assert conflict is not None and conflict.holder is older


def test_a_tie_in_creation_time_is_broken_by_key() -> None:
    a = claim("BaseModel/team-a/m", "/m/x", age=1)
    b = claim("BaseModel/team-b/m", "/m/x", owner=Owner("team-b", URI), age=1)
    index = ClaimIndex([a, b])
    assert find_conflict(a, index) is None
    blocked = find_conflict(b, index)
    assert blocked is not None and blocked.holder is a


def test_the_model_holding_the_directory_keeps_it() -> None:
    """Created in the same second with a smaller name, or even older: the holder of published weights wins."""
    holder = claim("BaseModel/team-a/victim", "/m/llama", age=5)
    same_second = claim("BaseModel/team-a/aaa", "/m/llama", owner=EVIL_ENDPOINT, age=5)
    older = claim("BaseModel/team-evil/old", "/m/llama/sub", owner=EVIL, age=1)
    index = ClaimIndex([holder, same_second, older])

    def holds(c: Claim) -> bool:
        return c.key == holder.key

    assert find_conflict(holder, index, holds=holds) is None
    for newcomer in (same_second, older):
        conflict = find_conflict(newcomer, index, holds=holds)
        assert conflict is not None and conflict.holder is holder
    # Without a holder, age decides and a tie goes by key ("aaa" < "victim").
    assert (c := find_conflict(holder, index)) is not None and c.holder is older
    assert (c := find_conflict(same_second, index)) is not None and c.holder is older


def test_holds_is_asked_only_about_overlapping_claims() -> None:
    asked: list[str] = []

    def holds(c: Claim) -> bool:
        asked.append(c.key)
        return False

    mine = claim("BaseModel/t/mine", "/m/a", owner=EVIL, age=9)
    index = ClaimIndex([claim(f"BaseModel/x/m{i}", f"/m/other{i}", age=1) for i in range(100)])
    assert find_conflict(mine, index, holds=holds) is None
    assert asked == []


def test_the_oldest_of_several_blockers_is_named() -> None:
    mine = claim("BaseModel/t/mine", "/m/a/b", owner=EVIL, age=9)
    blockers = [
        claim("BaseModel/x/child", "/m/a/b/c", owner=Owner("x", URI), age=5),
        claim("BaseModel/y/parent", "/m/a", owner=Owner("y", URI), age=3),
        claim("BaseModel/z/same", "/m/a/b", owner=Owner("z", URI), age=4),
    ]
    conflict = find_conflict(mine, ClaimIndex(blockers))
    assert conflict is not None and conflict.holder.key == "BaseModel/y/parent"


def test_read_only_claims() -> None:
    admin_local = claim(
        "ClusterBaseModel//weights", "/data/llama", owner=Owner("", "local:///data/llama"), mode=Mode.READ
    )
    other_admin_local = claim(
        "ClusterBaseModel//inner",
        "/data/llama/inner",
        owner=Owner("", "local:///data/llama/inner"),
        mode=Mode.READ,
        age=3,
    )
    tenant_write = claim("BaseModel/team-evil/w", "/data/llama", owner=EVIL, age=4)
    tenant_read = claim(
        "BaseModel/team-evil/r", "/data/llama", owner=Owner("team-evil", "local:///data/llama"), mode=Mode.READ, age=5
    )
    index = ClaimIndex([admin_local, other_admin_local, tenant_write, tenant_read])
    # A writer into an admin's local directory is refused (deleting it would trash the admin's weights).
    assert (c := find_conflict(tenant_write, index)) is not None and c.holder is admin_local
    # A tenant may not read another model's directory either.
    assert (c := find_conflict(tenant_read, index)) is not None and c.holder is admin_local
    # Two admins' read-only claims may overlap: nothing is written, both are the admin's.
    assert find_conflict(other_admin_local, index) is None


def test_a_writer_blocks_a_newer_reader() -> None:
    writer = claim("BaseModel/team-a/victim", "/m/llama", age=1)
    reader = claim("BaseModel/team-evil/peek", "/m/llama", owner=Owner("team-evil", "local:///m/llama"), mode=Mode.READ)
    reader = Claim(reader.key, reader.owner, reader.paths, reader.mode, "2026-01-01T00:00:02Z")
    conflict = find_conflict(reader, ClaimIndex([writer]))
    assert conflict is not None and conflict.holder is writer and "writes" in conflict.message


def test_a_claim_never_blocks_itself_and_live_here_filters() -> None:
    victim = claim("BaseModel/team-a/victim", "/m/llama", age=1)
    tenant = claim("BaseModel/team-evil/t", "/m/llama", owner=EVIL, age=2)
    index = ClaimIndex([victim, tenant])
    assert find_conflict(victim, index) is None
    asked: list[str] = []

    def elsewhere(c: Claim) -> bool:
        asked.append(c.key)
        return False

    assert find_conflict(tenant, index, live_here=elsewhere) is None
    assert asked == ["BaseModel/team-a/victim"]  # asked only about the claim that would block


def test_resolved_paths_count_too() -> None:
    # The victim wrote through a symlink: "/m/alias/x" as written, "/m/real/x" resolved.
    victim = claim("BaseModel/team-a/victim", ("/m/alias/x", "/m/real/x"), age=1)
    tenant = claim("BaseModel/team-evil/t", ("/m/real",), owner=EVIL, age=2)
    conflict = find_conflict(tenant, ClaimIndex([victim]))
    assert conflict is not None and conflict.relation == Relation.CONTAINS and conflict.their_path == "/m/real/x"


# ----------------------------------------------------------------------------- claims of raw objects


class FakeGate:
    """The layout's checks without a file system: ``/m`` is the only root, ``/m/alias`` links to ``/m/real``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    def writable(self, resolved: str) -> bool:
        return resolved.startswith("/m/")

    def check_local(self, raw: str, *, tenant: bool = False) -> Path:
        self.calls.append(("check_local", raw, tenant))
        if tenant and not raw.startswith("/m/"):
            raise PathRefused(f"{raw!r} outside")
        return Path(raw)

    def resolve(self, raw: str) -> str:
        self.calls.append(("resolve", raw, False))
        return raw.replace("/m/alias", "/m/real")


def raw_model(
    kind: str, name: str, uri: str, path: str | None = None, namespace: str = "", **storage: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"storageUri": uri, **storage}
    if path is not None:
        spec["path"] = path
    meta = {"name": name, "namespace": namespace, "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"}
    return {"kind": kind, "metadata": meta, "spec": {"storage": spec}}


def test_a_local_uri_without_a_path_claims_the_uri_path() -> None:
    got = claim_of("ClusterBaseModel", raw_model("ClusterBaseModel", "w", "local:///data/llama/"), FakeGate())
    assert got is not None
    assert got.paths == ("/data/llama",) and got.mode == Mode.READ and got.key == "ClusterBaseModel//w"


def test_claims_of_raw_objects() -> None:
    gate = FakeGate()
    hf = claim_of("BaseModel", raw_model("BaseModel", "a", URI, "/m/alias/x/", "team-a", key="s"), gate)
    assert hf is not None
    assert hf.paths == ("/m/alias/x", "/m/real/x") and hf.mode == Mode.WRITE
    assert hf.owner == Owner("team-a", URI, "s", {}) and hf.key == "BaseModel/team-a/a"
    # A tenant's local path is checked as a tenant's; refused, it claims nothing.
    assert claim_of("BaseModel", raw_model("BaseModel", "l", "local:///etc", None, "team-evil"), gate) is None
    assert ("check_local", "/etc", True) in gate.calls
    # Nothing written or read here, or refused by the layout: no claim.
    for raw in (
        raw_model("ClusterBaseModel", "v", "vendor://x/y/z", "/m/v"),
        raw_model("ClusterBaseModel", "p", "pvc://claim/x", "/m/p"),
        raw_model("ClusterBaseModel", "u", "foo://x", "/m/u"),
        raw_model("ClusterBaseModel", "out", URI, "/etc/x"),
        raw_model("ClusterBaseModel", "rel", URI, "m/x"),
        raw_model("ClusterBaseModel", "dots", URI, "/m/x/../y"),
        raw_model("ClusterBaseModel", "ctl", URI, "/m/x\ny"),
        raw_model("ClusterBaseModel", "private", URI, "/m"),  # FakeGate: only below /m/ is writable
        raw_model("ClusterBaseModel", "nopath", URI),
        {"metadata": {"name": "broken"}, "spec": {"storage": "not a mapping"}},
        {"metadata": {"name": "broken"}, "spec": {"storage": {"storageUri": 5, "path": "/m/x"}}},
    ):
        assert claim_of("ClusterBaseModel", raw, gate) is None, raw


class FakeStore:
    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}

    def values(self) -> list[dict[str, Any]]:
        return list(self.objs.values())


def test_the_cache_derives_each_object_version_once() -> None:
    gate = FakeGate()
    store = FakeStore([raw_model("ClusterBaseModel", f"m{i}", URI, f"/m/x{i}") for i in range(50)])
    cache = ClaimCache(gate)
    index = cache.index({"ClusterBaseModel": store})
    assert len(gate.calls) == 50 and len(index) == 50
    assert cache.index({"ClusterBaseModel": store}) is index and len(gate.calls) == 50  # nothing changed
    changed = raw_model("ClusterBaseModel", "m7", URI, "/m/moved")
    changed["metadata"]["resourceVersion"] = "2"
    store.objs["m7"] = changed
    assert len(cache.index({"ClusterBaseModel": store})) == 50
    assert len(gate.calls) == 51  # only the changed object was derived again
    assert [c.key for _, _, c in index.overlapping("/m/moved")] == ["ClusterBaseModel//m7"]
    assert not list(index.overlapping("/m/x7"))
    # A relist: every object a new dict, the same versions: nothing is derived again, nothing lost.
    store.objs = {name: dict(obj) for name, obj in store.objs.items()}
    assert len(cache.index({"ClusterBaseModel": store})) == 50 and len(gate.calls) == 51
    assert [c.key for _, _, c in index.overlapping("/m/x8")] == ["ClusterBaseModel//m8"]
    del store.objs["m9"]
    cache.index({"ClusterBaseModel": store})
    assert not list(index.overlapping("/m/x9")) and len(index) == 49


def test_the_index_after_adds_and_discards_equals_one_built_at_once() -> None:
    claims = [claim(f"BaseModel/t/m{i}", f"/m/{'a/' * (i % 4)}x{i % 7}", age=i) for i in range(60)]
    index = ClaimIndex()
    for c in claims:
        index.add(c)
    for c in claims[::3]:
        index.discard(c)
    kept = [c for i, c in enumerate(claims) if i % 3]
    fresh = ClaimIndex(kept)
    for probe in ["/", "/m", "/m/a", "/m/a/a", "/m/x1", "/m/a/x2", "/m/a/a/a/x3", "/n"]:
        got = sorted((r, p, c.key) for r, p, c in index.overlapping(probe))
        assert got == sorted((r, p, c.key) for r, p, c in fresh.overlapping(probe)), probe


def test_thousands_of_models_stay_cheap() -> None:
    """10,000 models under 100 teams; every one of them checked once: far below a pairwise comparison."""
    claims = [
        claim(f"BaseModel/t{i % 100}/m{i}", f"/models/t{i % 100}/m{i}", owner=Owner(f"t{i % 100}", URI), age=i % 60)
        for i in range(10_000)
    ]
    started = time.perf_counter()
    index = ClaimIndex(claims)
    conflicts = [find_conflict(c, index) for c in claims]
    elapsed = time.perf_counter() - started
    assert conflicts == [None] * len(claims)
    assert elapsed < 5.0, f"{elapsed:.2f}s for 10,000 checks"  # measured ~0.1 s; pairwise would be 10^8 steps


# ----------------------------------------------------------------------------------------- trash restore


@pytest.mark.parametrize(
    ("entry_key", "entry_owner", "claimant_key", "claimant", "allowed"),
    [
        ("ClusterBaseModel//llama", ADMIN.fingerprint, "ClusterBaseModel//llama", ADMIN, True),  # the same key
        ("ClusterBaseModel//llama", "", "ClusterBaseModel//llama", ADMIN, True),  # an old entry, the same key
        ("BaseModel/team-a/old", VICTIM.fingerprint, "BaseModel/team-a/new", VICTIM, True),  # the same owner
        ("ClusterBaseModel//llama", ADMIN.fingerprint, "BaseModel/team-evil/llama", EVIL, False),
        ("BaseModel/team-a/old", VICTIM.fingerprint, "BaseModel/team-a/new", EVIL_SECRET, False),
        ("BaseModel/team-a/old", VICTIM.fingerprint, "BaseModel/team-a/new", EVIL_ENDPOINT, False),
        ("BaseModel/team-a/old", "", "BaseModel/team-a/new", VICTIM, False),  # no recorded owner: own key only
    ],
)
def test_may_restore(entry_key: str, entry_owner: str, claimant_key: str, claimant: Owner, allowed: bool) -> None:
    assert may_restore(entry_key, entry_owner, claimant_key, claimant) is allowed


def test_the_fingerprint_covers_every_part_of_the_identity() -> None:
    prints = {o.fingerprint for o in (VICTIM, EVIL, EVIL_ENDPOINT, EVIL_SECRET, EVIL_URI, ADMIN)}
    assert len(prints) == 6
    assert (
        Owner("a", URI, "s", {"x": "1", "y": "2"}).fingerprint == Owner("a", URI, "s", {"y": "2", "x": "1"}).fingerprint
    )


def test_the_trash_restores_only_to_the_owner(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "models")
    layout.ensure()
    trash = Trash(layout)
    dest = layout.primary.path / "llama"
    dest.mkdir()
    (dest / "w").write_bytes(b"admin's")
    admin = ModelObject.from_dict(
        "ClusterBaseModel",
        raw_model("ClusterBaseModel", "llama", "s3://bucket/llama", str(dest), key="admin-secret"),
    )
    tenant_raw = raw_model("BaseModel", "llama", "s3://bucket/llama", str(dest), "team-evil")
    tenant = ModelObject.from_dict("BaseModel", tenant_raw)
    manifest = Manifest(
        key=admin.ref.key,
        uid="u",
        storage_uri="s3://bucket/llama",
        dest=str(dest),
        owner=Owner("", "s3://bucket/llama", "admin-secret").fingerprint,
    )
    assert trash.quarantine(manifest, layout.primary, "test") is not None
    assert trash.find_restorable("s3://bucket/llama", str(dest)) is not None  # unfiltered: found
    assert trash.find_restorable("s3://bucket/llama", str(dest), accept=restorable_by(tenant)) is None
    assert (
        trash.find_restorable("s3://bucket/llama", str(dest), accept=restorable_to(tenant.ref.key, tenant_raw)) is None
    )
    assert trash.find_restorable("s3://bucket/llama", str(dest), accept=restorable_by(admin)) is not None
    same_owner_elsewhere = raw_model("ClusterBaseModel", "llama-2", "s3://bucket/llama", str(dest), key="admin-secret")
    assert trash.find_restorable(
        "s3://bucket/llama", str(dest), accept=restorable_to("ClusterBaseModel//llama-2", same_owner_elsewhere)
    )


# -------------------------------------------------------------------------- the re-check at publish


class _Recorder:
    """Node labels and the ConfigMap alike, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def labels(self) -> dict[str, str]:
        return dict(self.values)

    def model_labels(self) -> dict[str, str]:
        return dict(self.values)

    def data(self) -> dict[str, str]:
        return dict(self.values)

    async def ensure(self, key: str, value: str | None) -> bool:
        if value is None:
            return self.values.pop(key, None) is not None
        self.values[key] = value
        return True


class _Events:
    def emit(self, ref: object, type_: str, reason: str, message: str) -> None:
        pass


class _GatedSource:
    """Stages one file, but only once the test lets the download finish."""

    rules = SourceRules()

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finish = asyncio.Event()

    async def fetch(self, request: FetchRequest) -> FetchResult:
        self.started.set()
        await asyncio.wait_for(self.finish.wait(), 5.0)
        request.staging.mkdir(parents=True, exist_ok=True)
        (request.staging / "w.safetensors").write_bytes(b"weights")
        return FetchResult(revision="r1", files=[FileRecord("w.safetensors", 7)], staged=["w.safetensors"])


async def test_ownership_is_checked_again_right_before_publish(tmp_path: Path) -> None:
    """A directory claimed by a model that comes first while the download runs: the fetch publishes nothing."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    dest = layout.primary.path / "team" / "llama"
    source = _GatedSource()
    fetcher = Fetcher(workers=1, on_done=lambda _key: None)
    tenant = raw_model("BaseModel", "tenant", "s3://bucket/llama", str(dest), "team-evil")
    tenant["metadata"]["creationTimestamp"] = "2026-06-01T00:00:00Z"
    stores: dict[str, dict[str, Any]] = {"BaseModel": {"team-evil/tenant": tenant}, "ClusterBaseModel": {}}
    reconciler = _reconciler(layout, stores, fetcher=fetcher, sources={StorageType.S3: source})
    ctx = reconciler.ctx
    obj = ModelObject.from_dict("BaseModel", tenant)
    target = reconciler.target_of(obj)  # nobody else here yet: accepted
    try:
        submitted = await fetcher.submit(
            obj.ref.key, target.id, lambda job: reconciler._fetch(job, obj.ref, obj, target, None)
        )
        assert submitted
        await asyncio.wait_for(source.started.wait(), 5.0)
        # Meanwhile an older model (another owner) is pointed at the parent directory.
        admin = raw_model("ClusterBaseModel", "admin", "hf://acme/llama", str(dest.parent))
        stores["ClusterBaseModel"]["admin"] = admin
        source.finish.set()

        async def ended() -> None:
            while fetcher.job(obj.ref.key) is not None:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(ended(), 5.0)
    finally:
        await asyncio.wait_for(fetcher.stop(), 5.0)
    failure = fetcher.failure(obj.ref.key, target.id)
    assert failure is not None and failure.reason == "PathConflict", failure
    assert "ClusterBaseModel//admin" in failure.message and "one owner per directory tree" in failure.message
    assert not dest.exists()  # nothing published into the admin's tree
    assert ctx.manifests.load(obj.ref.key) is None


def _reconciler(
    layout: Layout,
    stores: dict[str, dict[str, Any]],
    shared_roots: Any = None,
    *,
    fetcher: Fetcher | None = None,
    sources: dict[StorageType, Any] | None = None,
) -> Reconciler:
    """A reconciler over ``layout`` and the cached objects ``stores``, with recorders for labels, entries, Events."""
    ctx = Context(
        client=None,  # type: ignore[arg-type]
        node_name="n1",
        namespace="ome",
        layout=layout,
        manifests=ManifestStore(layout),
        trash=Trash(layout),
        labels=_Recorder(),  # type: ignore[arg-type]
        configmap=_Recorder(),  # type: ignore[arg-type]
        fetcher=fetcher or Fetcher(workers=1, on_done=lambda _key: None),
        events=_Events(),  # type: ignore[arg-type]
        metrics=Metrics(),
        remover=None,  # type: ignore[arg-type]
        hf=None,  # type: ignore[arg-type]
        models_store=stores,
        requeue_after=lambda _key, _delay: None,
        sources=sources or {},
        shared_roots=shared_roots,
    )
    return Reconciler(ctx)


def test_a_tenant_local_path_into_a_shared_artifact_is_refused_without_naming_it(tmp_path: Path) -> None:
    """A tenant's ``local://`` straight into a ClusterBaseModel's ``_artifacts/<id>/<commit>`` (inside the root, so
    the tenant rule alone admits it): refused whatever the CBM's claim says, and the reason names no snapshot."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    snapshot = layout.primary.path / "models" / "_artifacts" / "meta-llama" / "Llama" / ("c" * 40)
    snapshot.mkdir(parents=True)
    tenant = raw_model("BaseModel", "steal", f"local://{snapshot}", None, "team-evil")
    reconciler = _reconciler(layout, {"BaseModel": {"team-evil/steal": tenant}, "ClusterBaseModel": {}})
    with pytest.raises(Invalid) as refused:
        reconciler.target_of(ModelObject.from_dict("BaseModel", tenant))
    assert refused.value.reason == "InvalidPath"
    assert "meta-llama" not in refused.value.message and "c" * 40 not in refused.value.message
    # An admin's local:// may still name one (cluster admins are trusted).
    admin = raw_model("ClusterBaseModel", "pin", f"local://{snapshot}")
    assert reconciler.target_of(ModelObject.from_dict("ClusterBaseModel", admin)).dest == snapshot


class _SharedEverywhere:
    """The shared-root verdict only (every root is shared with another node)."""

    def verdict(self, _root: Any, *, fresh: bool = False) -> Any:
        return type("Verdict", (), {"shared": True})()


def test_on_a_shared_root_a_model_that_selects_other_nodes_still_owns_its_directory(tmp_path: Path) -> None:
    """The ownership index counts every live model whose directory is on a shared root, not only the models that
    select this node: a tenant's model selecting node A never takes a ClusterBaseModel's directory that only
    node B's model selects (both nodes see the same files)."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    dest = layout.primary.path / "llama"
    admin = raw_model("ClusterBaseModel", "llama", "hf://meta/llama", str(dest), nodeSelector={"pool": "b"})
    tenant = raw_model("BaseModel", "steal", "s3://evil/x", str(dest), "team-evil", nodeSelector={"pool": "a"})
    tenant["metadata"]["creationTimestamp"] = "2026-06-01T00:00:00Z"  # the admin's came first
    stores = {"BaseModel": {"team-evil/steal": tenant}, "ClusterBaseModel": {"llama": admin}}
    private = _reconciler(layout, stores)  # a private root: the admin's model does not use this node
    assert private.target_of(ModelObject.from_dict("BaseModel", tenant)).dest == dest
    shared = _reconciler(layout, stores, _SharedEverywhere())
    with pytest.raises(Invalid) as refused:
        shared.target_of(ModelObject.from_dict("BaseModel", tenant))
    assert refused.value.reason == "PathConflict" and "ClusterBaseModel//llama" in refused.value.message


class _ShapeSource:
    rules = SourceRules(shape_filter=True)


def test_a_shape_filtered_model_is_refused_on_a_shared_root_and_kept_on_a_private_one(tmp_path: Path) -> None:
    """TensorRT-LLM serving models take the files of this node's shape; the target's identity (source and path) does
    not name the shape, so on a shared root a node of another shape would serve these files: refused, clearly."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    dest = layout.primary.path / "trt"
    obj = raw_model("ClusterBaseModel", "trt", "oci://n/ns/b/bucket/o/engines", str(dest))
    obj["spec"]["modelFormat"] = {"name": "tensorrtllm"}
    stores: dict[str, dict[str, Any]] = {"BaseModel": {}, "ClusterBaseModel": {"trt": obj}}
    for shared, refused in ((None, False), (_SharedEverywhere(), True)):
        reconciler = _reconciler(layout, stores, shared)
        reconciler.ctx.sources = {StorageType.OCI: _ShapeSource()}  # type: ignore[dict-item]
        reconciler.ctx.labels.values["node.kubernetes.io/instance-type"] = "BM.GPU.A10.4"  # type: ignore[attr-defined]
        if not refused:
            assert reconciler.target_of(ModelObject.from_dict("ClusterBaseModel", obj)).dest == dest
            continue
        with pytest.raises(Invalid) as caught:
            reconciler.target_of(ModelObject.from_dict("ClusterBaseModel", obj))
        assert caught.value.reason == "PathRefused" and "shape" in caught.value.message
