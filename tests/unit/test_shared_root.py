"""Unit tests for shared model roots: the decisions as tables, and the coordinator over one in-memory Lease API.

:class:`LeaseApi` is a tiny stateful stand-in for the API server's Lease endpoints (create, get, update with
resourceVersion), shared by several :class:`SharedRoots` that play nodes over one directory. Every wait has a
deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.confirm import Outcome
from model_agent.agent.fetcher import Fetcher, Job
from model_agent.agent.requeue import Requeue
from model_agent.agent.shared_root import (
    FULL,
    WAITING_FOR_PEER,
    FetchTurn,
    RemovalPlan,
    SharedRoots,
    VerifyTurn,
    check_publication,
    confirmed_gone,
    fetch_turn,
    files_digest,
    fresh_verification,
    publication_bytes,
    purge_allowed,
    removal_plan,
    verification_bytes,
    verify_turn,
)
from model_agent.kube.client import ApiError
from model_agent.local.layout import Layout
from model_agent.local.manifest import FileRecord, Manifest, ManifestStore
from model_agent.model.entry import BytesBySource
from model_agent.sources.base import Progress
from model_agent.sources.byte_sources import by_source
from tests.support.hostile_json import DEEP
from tests.support.waiting import eventually

DEADLINE_S = 5.0
URI = "hf://org/model"
KEY = "ClusterBaseModel//m1"

# ------------------------------------------------------------------------------------------ decisions


@pytest.mark.parametrize(
    ("shared", "published", "holds", "turn"),
    [
        (False, False, False, FetchTurn.ALONE),
        (False, True, True, FetchTurn.ALONE),  # a private root never looks at peers
        (True, True, False, FetchTurn.ADOPT),
        (True, True, True, FetchTurn.ADOPT),  # published between the look and the Lease: no second fetch
        (True, False, True, FetchTurn.FETCH),
        (True, False, False, FetchTurn.WAIT),
    ],
)
def test_fetch_turn(shared: bool, published: bool, holds: bool, turn: FetchTurn) -> None:
    assert fetch_turn(shared, published, holds) == turn


# On a shared root the link of a shared artifact goes only where the files may go (never on a deselected node).
KEEP = " (weights kept: shared root, other nodes may serve them)"
KEEP_SHARED = RemovalPlan(False, False, False, False, KEEP, release_link=False)
KEEP_OWN_RECORD = RemovalPlan(False, False, False, True, KEEP, release_link=False)
MOVED = " (weights not moved: another node already moved or restored them)"
NOT_OURS = RemovalPlan(False, False, False, False, MOVED, release_link=False)


@pytest.mark.parametrize(
    ("shared", "gone", "holds", "records_shared", "ours", "plan"),
    [
        (False, True, False, True, True, FULL),  # a private root: the removal as always
        (False, False, False, True, True, FULL),
        (False, True, False, True, False, FULL),
        (True, False, False, True, True, KEEP_SHARED),  # deselected: label and entry only
        (True, False, True, True, True, KEEP_SHARED),
        (True, False, False, False, True, KEEP_OWN_RECORD),  # a --state-dir record is this node's own
        (True, True, True, True, True, FULL),  # gone, trash Lease held: files to the trash, once
        (True, True, True, True, False, NOT_OURS),  # moved already, or a peer restored a re-created copy
        (True, True, False, True, True, None),  # gone, another node moves the files now: requeue
        (True, True, False, False, True, None),
    ],
)
def test_removal_plan(
    shared: bool, gone: bool, holds: bool, records_shared: bool, ours: bool, plan: RemovalPlan | None
) -> None:
    assert removal_plan(shared, gone, holds, records_shared, ours) == plan


@pytest.mark.parametrize(
    ("shared", "holds", "allowed"),
    [(False, False, True), (False, True, True), (True, True, True), (True, False, False)],
)
def test_purge_has_one_owner_on_a_shared_root(shared: bool, holds: bool, allowed: bool) -> None:
    assert purge_allowed(shared, holds) is allowed


@pytest.mark.parametrize(
    ("shared", "recent", "holds", "turn"),
    [
        (False, True, False, VerifyTurn.ALONE),  # a private root re-hashes every pass, whatever a record says
        (False, False, True, VerifyTurn.ALONE),
        (True, True, False, VerifyTurn.SKIP),  # a peer verified these files this round
        (True, True, True, VerifyTurn.SKIP),  # it finished between the first look and the Lease
        (True, False, True, VerifyTurn.VERIFY),
        (True, False, False, VerifyTurn.BUSY),  # a peer holds the Lease: it is hashing them now
    ],
)
def test_verify_turn(shared: bool, recent: bool, holds: bool, turn: VerifyTurn) -> None:
    assert verify_turn(shared, recent, holds) == turn


INTERVAL = 100.0


@pytest.mark.parametrize(
    ("record", "now", "fresh"),
    [
        (verification_bytes("d", "n2", 1000.0, []), 1000.0 + 0.79 * INTERVAL, True),
        (verification_bytes("d", "n2", 1000.0, []), 1000.0 + 0.8 * INTERVAL, False),  # due again this round
        (verification_bytes("d", "n2", 1000.0, ["w.bin"]), 1001.0, False),  # a failure is never skipped
        (verification_bytes("other", "n2", 1000.0, []), 1001.0, False),  # another file list (a refetch since)
        (verification_bytes("d", "n2", 1000.0, []), 994.0, False),  # dated ahead of this clock by more than 5 s
        (verification_bytes("d", "n2", 1000.0, []), 996.0, True),  # a little clock skew is tolerated
        (None, 1000.0, False),
        (b"{", 1000.0, False),
        (b'{"files": "d", "result": "success"}', 1000.0, False),
        (b"[]", 1000.0, False),
        (b"null", 1000.0, False),
        (b'"x"', 1000.0, False),
        (b'{"files": "d", "result": "success", "verifiedAt": []}', 1000.0, False),
        (b'{"files": "d", "result": "success", "verifiedAt": 1%s}' % (b"0" * 400), 1000.0, False),  # beyond float
        (DEEP.encode(), 1000.0, False),
    ],
)
def test_fresh_verification(record: bytes | None, now: float, fresh: bool) -> None:
    assert fresh_verification(record, "d", now, INTERVAL) is fresh


def _live(uri: str, path: str) -> dict[str, Any]:
    return {"metadata": {"uid": "u2"}, "spec": {"storage": {"storageUri": uri, "path": path}}}


@pytest.mark.parametrize(
    ("outcome", "live", "gone"),
    [
        (Outcome.CONFIRMED_GONE, None, True),
        (Outcome.DELETING, _live(URI, "/m/a"), True),
        (Outcome.ALIVE_SAME_UID, _live(URI, "/m/a"), False),  # only the selection moved
        (Outcome.RECREATED_NEW_UID, _live(URI, "/m/a"), False),  # a successor wants these very files
        (Outcome.RECREATED_NEW_UID, _live(URI, "/m/a/"), False),  # the same directory spelled differently
        (Outcome.RECREATED_NEW_UID, _live("hf://org/other", "/m/a"), True),
        (Outcome.RECREATED_NEW_UID, _live(URI, "/m/b"), True),
    ],
)
def test_confirmed_gone(outcome: Outcome, live: dict[str, Any] | None, gone: bool) -> None:
    manifest = Manifest(key=KEY, uid="u1", storage_uri=URI, dest="/m/a")
    assert confirmed_gone(outcome, live, manifest) is gone


# ------------------------------------------------------------------------------------------ publications


def _published(dest: Path, **changes: Any) -> Manifest:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "w.bin").write_bytes(b"weights")
    st = (dest / "w.bin").stat()
    manifest = Manifest(
        key=KEY,
        uid="u1",
        storage_uri=URI,
        dest=str(dest),
        files=[FileRecord("w.bin", st.st_size, "ab" * 32, None, st.st_mtime_ns)],
    )
    for name, value in changes.items():
        setattr(manifest, name, value)
    return manifest


def test_a_valid_publication_is_adopted(tmp_path: Path) -> None:
    manifest = _published(tmp_path / "m")
    adopted, why = check_publication(publication_bytes(manifest.to_json(), "n1", 1.0), URI, tmp_path / "m")
    assert why == ""
    assert adopted is not None and adopted.files == manifest.files


def test_publications_that_are_not_adopted(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    manifest = _published(dest)
    good = publication_bytes(manifest.to_json(), "n1", 1.0)
    record = json.loads(good)
    record["manifest"] = record["manifest"].replace('"uid": "u1"', '"uid": "u9"')  # text changed, checksum not
    cases = {
        b"{": "unreadable publication record",
        json.dumps(record).encode(): "publication checksum mismatch",
    }
    for data, why in cases.items():
        assert check_publication(data, URI, dest) == (None, why)
    assert check_publication(good, "hf://org/other", dest)[1] == "published for another source or destination"
    assert check_publication(good, URI, tmp_path / "elsewhere")[1] == "published for another source or destination"
    removing = publication_bytes(_published(dest, removing="deleted").to_json(), "n1", 1.0)
    assert check_publication(removing, URI, dest)[1] == "being removed"
    (dest / "w.bin").write_bytes(b"changed!")  # size differs: stat alone tells
    problem = check_publication(good, URI, dest)[1]
    assert problem.startswith("files changed since publication")


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (lambda m: b"[]", "unreadable publication record"),
        (lambda m: b"null", "unreadable publication record"),
        (lambda m: DEEP.encode(), "unreadable publication record"),
        (lambda m: json.dumps({"manifest": "\ud800", "sha256": "x"}).encode(), "unreadable publication record"),
        (lambda m: publication_bytes('"x"', "n1", 1.0), "unreadable published manifest"),
        (lambda m: publication_bytes("null", "n1", 1.0), "unreadable published manifest"),
        (lambda m: publication_bytes(DEEP, "n1", 1.0), "unreadable published manifest"),
        (lambda m: publication_bytes(_doc(m, dest=[]), "n1", 1.0), "unreadable published manifest"),
        (lambda m: publication_bytes(_doc(m, files=[{"path": "w.bin", "size": "7"}]), "n1", 1.0), "unreadable"),
        (lambda m: publication_bytes(_doc(m, files=[{"path": "w\x00", "size": 7}]), "n1", 1.0), "files changed"),
    ],
    ids=[
        "list",
        "null",
        "deep",
        "lone surrogate",
        "manifest a string",
        "manifest null",
        "manifest deep",
        "dest a list",
        "size a string",
        "path with NUL",
    ],
)
def test_a_publication_of_the_wrong_shape_is_not_adopted(
    tmp_path: Path, record: Callable[[Manifest], bytes], why: str
) -> None:
    manifest = _published(tmp_path / "m")
    adopted, because = check_publication(record(manifest), URI, tmp_path / "m")
    assert adopted is None and because.startswith(why)


def _doc(manifest: Manifest, **changes: Any) -> str:
    return json.dumps(json.loads(manifest.to_json()) | changes)


# ------------------------------------------------------------------------------------------ the coordinator


class LeaseApi:
    """Objects in memory by name (Leases, and the ConfigMaps of resolve records): GET, POST (409 if it exists), PUT
    (409 on a stale resourceVersion), a merge PATCH of ``data``; a LIST and a WATCH of one name
    (``fieldSelector=metadata.name=...``), what a reflector with a field selector asks; ``lists``/``watches`` count
    them."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.puts: list[str] = []
        self.lists = 0
        self.watches = 0
        self._watchers: list[tuple[str, asyncio.Queue[dict[str, Any]]]] = []

    async def request(
        self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None, **_kw: Any
    ) -> Any:
        await asyncio.sleep(0)
        if method == "GET" and query is not None:  # a LIST
            self.lists += 1
            name = _named(query)
            items = [json.loads(json.dumps(self.leases[name]))] if name in self.leases else []
            return {"metadata": {"resourceVersion": str(self.version)}, "items": items}
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.leases:
                raise ApiError(409, {"reason": "AlreadyExists"}, method, path)
            return self._store(name, body)
        name = path.rsplit("/", 1)[1]
        current = self.leases.get(name)
        if current is None:
            raise ApiError(404, {"reason": "NotFound", "details": {"name": name}}, method, path)
        if method == "GET":
            return json.loads(json.dumps(current))
        if method == "PUT":
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiError(409, {"reason": "Conflict"}, method, path)
            self.puts.append(body["spec"].get("holderIdentity", ""))
            return self._store(name, body)
        if method == "PATCH":  # a merge patch of a ConfigMap's data (a resolve record rewritten)
            merged = json.loads(json.dumps(current))
            merged.setdefault("data", {}).update(body.get("data") or {})
            return self._store(name, merged)
        raise AssertionError(method)

    async def watch_lines(self, _path: str, *, query: dict[str, Any], **_kw: Any) -> AsyncIterator[dict[str, Any]]:
        """The events of one name from now on (the list just before is current: nothing is missed here)."""
        self.watches += 1
        watcher = (_named(query), asyncio.Queue[dict[str, Any]]())
        self._watchers.append(watcher)
        try:
            while True:
                yield await watcher[1].get()
        finally:
            self._watchers.remove(watcher)

    def _store(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored: dict[str, Any] = json.loads(json.dumps(body))
        stored["metadata"]["resourceVersion"] = str(self.version)
        event = "MODIFIED" if name in self.leases else "ADDED"
        self.leases[name] = stored
        for wanted, events in self._watchers:
            if wanted == name:
                events.put_nowait({"type": event, "object": json.loads(json.dumps(stored))})
        answer: dict[str, Any] = json.loads(json.dumps(stored))
        return answer


def _named(query: dict[str, Any]) -> str:
    selector = str(query.get("fieldSelector", ""))
    assert selector.startswith("metadata.name="), query  # (nothing else is listed or watched here)
    return selector.removeprefix("metadata.name=")


class FakeJob:
    def __init__(self) -> None:
        self.progress = Progress()


def node(api: LeaseApi, root: Path, name: str, *, forced: bool = False) -> tuple[SharedRoots, ManifestStore]:
    layout = Layout(root)
    layout.ensure()
    manifests = ManifestStore(layout)
    shared = SharedRoots(api, "ome", name, layout, manifests, forced=forced, lease_s=30, poll_s=0.01)  # type: ignore[arg-type]
    shared.mark()
    return shared, manifests


def test_a_second_node_makes_the_root_shared_for_both(tmp_path: Path) -> None:
    api = LeaseApi()
    first, _ = node(api, tmp_path, "n1")
    assert first.status()[0]["shared"] is False
    second, _ = node(api, tmp_path, "n2")
    assert second.status()[0]["shared"] is True
    assert second.status()[0]["peers"] == ["n1"]
    assert first.verdict(first._layout.primary, fresh=True).shared  # the first node learns it too


async def test_one_node_fetches_and_the_others_adopt_without_fetching(tmp_path: Path) -> None:
    api = LeaseApi()
    nodes = [node(api, tmp_path, f"n{i}") for i in range(4)]
    root = nodes[0][0]._layout.primary
    dest = root.path / "m"
    fetched: list[str] = []
    release = asyncio.Event()
    jobs = [FakeJob() for _ in nodes]

    def fetcher(name: str, manifests: ManifestStore) -> Any:
        async def fetch() -> None:
            fetched.append(name)
            await release.wait()
            manifests.save(_published(dest), root)

        return fetch

    tasks = [
        asyncio.create_task(shared.fetch_once(jobs[i], KEY, URI, dest, root, fetcher(f"n{i}", manifests)))
        for i, (shared, manifests) in enumerate(nodes)
    ]
    async with asyncio.timeout(DEADLINE_S):
        while sum(job.progress.phase == WAITING_FOR_PEER for job in jobs) < 3:
            await asyncio.sleep(0.01)
    release.set()
    async with asyncio.timeout(DEADLINE_S):
        adopted = await asyncio.gather(*tasks)
    assert len(fetched) == 1  # one fetch for the cluster
    assert (root.private / "shared").is_dir()  # the holder published
    assert api.puts[-1] == ""  # and released its Lease
    # The fetching node adopted nothing; each other node adopted the whole model from the shared root, and its
    # job's progress says so (the entry's bytesBySource, the metric's "shared").
    size = len(b"weights")
    assert sorted(adopted) == [0, size, size, size]
    adopters = [job for job, n in zip(jobs, adopted, strict=True) if n]
    assert all(by_source(job.progress) == BytesBySource(shared_root=size) for job in adopters)


async def test_a_dead_holders_lease_expires_and_another_node_fetches(tmp_path: Path) -> None:
    api = LeaseApi()
    (a, _), (b, b_manifests) = node(api, tmp_path, "a"), node(api, tmp_path, "b")
    root = a._layout.primary
    dest = root.path / "m"
    started = asyncio.Event()

    async def hangs() -> None:
        started.set()
        await asyncio.Event().wait()

    dying = asyncio.create_task(a.fetch_once(FakeJob(), KEY, URI, dest, root, hangs))
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    # "SIGKILL": the Lease stays held (never released, never renewed) — its renewTime is in the past.
    dying.cancel()
    await asyncio.gather(dying, return_exceptions=True)
    (lease,) = [lease for lease in api.leases.values() if lease["spec"]["holderIdentity"] == ""]
    lease["spec"]["holderIdentity"] = "a"  # as a killed holder leaves it
    lease["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"
    lease["spec"]["leaseDurationSeconds"] = 0.2  # (short: b must see it unchanged this long on its own clock)

    async def fetch() -> None:
        b_manifests.save(_published(dest), root)

    async with asyncio.timeout(DEADLINE_S):
        await b.fetch_once(FakeJob(), KEY, URI, dest, root, fetch)
    assert b_manifests.load(KEY) is not None


async def test_a_private_root_fetches_without_any_lease(tmp_path: Path) -> None:
    api = LeaseApi()
    alone, _ = node(api, tmp_path, "n1")
    ran: list[bool] = []

    async def fetch() -> None:
        ran.append(True)

    await alone.fetch_once(FakeJob(), KEY, URI, tmp_path / "m", alone._layout.primary, fetch)
    assert ran == [True] and api.leases == {}


async def test_the_trash_turn_is_one_nodes_at_a_time(tmp_path: Path) -> None:
    api = LeaseApi()
    (a, manifests), (b, _) = node(api, tmp_path, "a"), node(api, tmp_path, "b")
    root = a._layout.primary
    dest = root.path / "m"
    manifests.save(_published(dest), root)
    async with a.removal_turn(KEY, str(dest), gone=True, uid="u1") as plan:
        assert plan == FULL
        with pytest.raises(Requeue):
            async with b.removal_turn(KEY, str(dest), gone=True, uid="u1"):
                raise AssertionError("two nodes moving one model's files")
        with pytest.raises(Requeue):
            async with b.restore_turn(KEY, dest):
                raise AssertionError("a restore during a removal")
        manifests.delete(KEY)  # the holder moved the files and dropped the record
    async with b.removal_turn(KEY, str(dest), gone=True, uid="u1") as plan:  # released: the next finds nothing
        assert plan == NOT_OURS
    manifests.save(_published(dest, uid="u2"), root)  # a peer restored the copy for a re-created object
    async with b.removal_turn(KEY, str(dest), gone=True, uid="u1") as plan:
        assert plan == NOT_OURS  # the late removal of the old object never moves the new one's files
    async with b.removal_turn(KEY, str(dest), gone=False) as plan:
        assert not plan.move_files and not plan.delete_record


async def test_purge_runs_on_one_node_of_a_shared_root(tmp_path: Path) -> None:
    api = LeaseApi()
    (a, _), (b, _) = node(api, tmp_path, "a"), node(api, tmp_path, "b")
    inside = asyncio.Event()
    leave = asyncio.Event()

    async def slow_purge() -> list[str]:
        inside.set()
        await leave.wait()
        return ["a"]

    async def quick_purge() -> list[str]:
        return ["b"]

    first = asyncio.create_task(a.as_purge_owner(slow_purge))
    await asyncio.wait_for(inside.wait(), DEADLINE_S)
    assert await asyncio.wait_for(b.as_purge_owner(quick_purge), DEADLINE_S) == []  # not while a purges
    leave.set()
    assert await asyncio.wait_for(first, DEADLINE_S) == ["a"]
    assert await asyncio.wait_for(b.as_purge_owner(quick_purge), DEADLINE_S) == ["b"]


async def test_a_shared_root_re_hashes_a_model_on_one_node_per_interval(tmp_path: Path) -> None:
    api = LeaseApi()
    (a, manifests), (b, _), (c, _) = node(api, tmp_path, "a"), node(api, tmp_path, "b"), node(api, tmp_path, "c")
    manifest = _published(tmp_path / "m")
    async with a.verify_turn(manifest, INTERVAL) as turn:
        assert turn == VerifyTurn.VERIFY
        async with b.verify_turn(manifest, INTERVAL) as other:
            assert other == VerifyTurn.BUSY  # a is hashing it now
        await asyncio.to_thread(a.record_verification, manifest, [])
    records = list((tmp_path / ".model-agent" / "shared" / "verified").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["node"] == "a"
    for peer in (b, c):
        async with peer.verify_turn(manifest, INTERVAL) as turn:
            assert turn == VerifyTurn.SKIP  # verified this round: no second hash, no Lease asked
    leases_before = len(api.puts)
    async with c.verify_turn(manifest, INTERVAL) as turn:
        assert turn == VerifyTurn.SKIP
    assert len(api.puts) == leases_before
    # The next round: the record is older than the round, one node (whichever comes first) hashes again.
    await asyncio.to_thread(a.record_verification, manifest, [], 0.0)
    async with b.verify_turn(manifest, INTERVAL) as turn:
        assert turn == VerifyTurn.VERIFY
        await asyncio.to_thread(b.record_verification, manifest, ["w.bin"])
    async with c.verify_turn(manifest, INTERVAL) as turn:
        assert turn == VerifyTurn.VERIFY  # b found damage: never a reason to skip
    refetched = _published(tmp_path / "m")
    refetched.files = [dataclasses.replace(f, mtime_ns=f.mtime_ns + 1) for f in refetched.files]
    assert files_digest(refetched) != files_digest(manifest)
    await asyncio.to_thread(c.record_verification, manifest, [])
    async with a.verify_turn(refetched, INTERVAL) as turn:
        assert turn == VerifyTurn.VERIFY  # the files changed since the record: it does not cover them
    assert manifests.load(KEY) is None  # the turn never writes manifests


async def test_a_private_root_verifies_without_a_lease_or_a_record(tmp_path: Path) -> None:
    api = LeaseApi()
    alone, _ = node(api, tmp_path, "n1")
    manifest = _published(tmp_path / "m")
    for _ in range(2):
        async with alone.verify_turn(manifest, INTERVAL) as turn:
            assert turn == VerifyTurn.ALONE
        await asyncio.to_thread(alone.record_verification, manifest, [])
    assert api.leases == {}
    assert not (tmp_path / ".model-agent" / "shared" / "verified").exists()


async def test_waiting_for_a_peer_never_holds_a_download_slot_and_a_long_wait_is_told(tmp_path: Path) -> None:
    """Node b waits while node a holds the target's fetch (renewing its Lease, publishing nothing: a hung mount).
    b's only download slot stays free for its other models, and the wait past ``long_wait_s`` is reported."""
    api = LeaseApi()
    (a, _), (b, _) = node(api, tmp_path, "a"), node(api, tmp_path, "b")
    b.long_wait_s = 0.05
    dest = tmp_path / "m"
    inside, leave = asyncio.Event(), asyncio.Event()

    async def hangs() -> None:
        inside.set()
        await leave.wait()

    async def never() -> None:
        raise AssertionError("b fetched while a holds the target")

    holder = asyncio.create_task(a.fetch_once(FakeJob(), KEY, URI, dest, a._layout.primary, hangs))
    await asyncio.wait_for(inside.wait(), DEADLINE_S)
    fetcher = Fetcher(workers=1, on_done=lambda _key: None)
    long_waits: list[float] = []
    other_done = asyncio.Event()

    async def waiting(job: Job) -> None:
        await b.fetch_once(job, KEY, URI, dest, b._layout.primary, never, on_long_wait=long_waits.append)

    async def other(job: Job) -> None:
        other_done.set()

    try:
        assert await fetcher.submit(KEY, "target", waiting)

        async def shown_waiting() -> bool:
            job = fetcher.job(KEY)
            return job is not None and job.progress.phase == "waiting-for-peer"

        await eventually(shown_waiting, timeout=DEADLINE_S, what="b waiting for a", interval=0.005)
        assert await fetcher.submit("ClusterBaseModel/other", "other-target", other)
        await asyncio.wait_for(other_done.wait(), DEADLINE_S)  # the one slot was free for it

        async def told() -> bool:
            return bool(long_waits)

        await eventually(told, timeout=DEADLINE_S, what="the long wait reported", interval=0.01)
        assert long_waits[0] >= 0.05
    finally:
        leave.set()
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        await fetcher.stop()
