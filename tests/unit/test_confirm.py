"""Unit tests for :func:`confirm_absence`: the live read that every destructive act must pass first.

The decision table is exercised for both kinds (cluster-scoped and namespaced) against
:class:`~tests.support.fake_kube.FakeKubeClient`, a fake with scripted answers (no server). Nothing sleeps
to synchronise: stalled reads wait on events that are never set, and every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from model_agent.agent.confirm import Confirmation, Confirmer, Outcome, confirm_absence
from model_agent.kube.client import ApiError, ApiUnavailable
from model_agent.model.resources import ModelKind, ModelRef
from tests.support.fake_kube import FakeKubeClient, not_found, status_error, type_not_found

DEADLINE_S = 2.0
UID = "11111111-1111-1111-1111-111111111111"
OTHER_UID = "22222222-2222-2222-2222-222222222222"

CLUSTER = ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", "llama-3")
NAMESPACED = ModelRef(ModelKind.BASE_MODEL, "team-a", "llama-3")
PATHS = {
    CLUSTER: "/apis/ome.io/v1beta1/clusterbasemodels/llama-3",
    NAMESPACED: "/apis/ome.io/v1beta1/namespaces/team-a/basemodels/llama-3",
}
PLURALS = {CLUSTER: "clusterbasemodels", NAMESPACED: "basemodels"}

both_kinds = pytest.mark.parametrize("ref", [CLUSTER, NAMESPACED], ids=["ClusterBaseModel", "BaseModel"])


def live_object(ref: ModelRef, uid: str | None = UID, **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": ref.name, "resourceVersion": "7", **meta}
    if uid is not None:
        metadata["uid"] = uid
    if ref.namespace:
        metadata["namespace"] = ref.namespace
    return {
        "apiVersion": "ome.io/v1beta1",
        "kind": ref.kind.value,
        "metadata": metadata,
        "spec": {"storage": {"storageUri": "hf://meta/llama-3", "path": "/models/llama-3"}},
    }


async def confirm(client: FakeKubeClient, ref: ModelRef, uid: str = UID, deadline_s: float = 10.0) -> Confirmation:
    return await asyncio.wait_for(confirm_absence(client, ref, uid, deadline_s=deadline_s), DEADLINE_S)  # type: ignore[arg-type]


def scripted(ref: ModelRef, *answers: Any) -> FakeKubeClient:
    client = FakeKubeClient()
    client.script("GET", PATHS[ref], *answers)
    return client


# ------------------------------------------------------------------------------------- decision table


@both_kinds
async def test_own_not_found_confirms_gone_with_a_live_get_of_the_object(ref: ModelRef) -> None:
    client = scripted(ref, not_found(ref.name, PLURALS[ref]))
    result = await confirm(client, ref, deadline_s=3.0)
    assert result.outcome == Outcome.CONFIRMED_GONE
    assert result.outcome.proves_absence
    assert result.live is None
    # One consistent read of exactly this object, with the deadline handed to the client.
    assert [(c.method, c.path) for c in client.calls] == [("GET", PATHS[ref])]
    assert client.calls[0].timeout == 3.0


@both_kinds
@pytest.mark.parametrize(
    "error",
    [
        pytest.param(type_not_found(), id="resource-type-gone"),
        pytest.param(
            ApiError(404, {"kind": "Status", "reason": "NotFound", "details": {"group": "ome.io"}}, "GET", "/"),
            id="details-without-name",
        ),
        pytest.param(ApiError(404, {"message": "404 page not found"}, "GET", "/"), id="plain-text-404"),
        pytest.param(not_found("another-model", "clusterbasemodels"), id="names-another-object"),
    ],
)
async def test_a_404_that_does_not_name_the_object_proves_nothing(ref: ModelRef, error: ApiError) -> None:
    client = scripted(ref, error)
    result = await confirm(client, ref)
    assert result.outcome == Outcome.READ_FAILED
    assert not result.outcome.proves_absence


@both_kinds
async def test_another_uid_is_a_recreated_object_and_the_live_object_is_returned(ref: ModelRef) -> None:
    live = live_object(ref, OTHER_UID)
    client = scripted(ref, live)
    result = await confirm(client, ref)
    assert result.outcome == Outcome.RECREATED_NEW_UID
    assert result.outcome.proves_absence
    assert result.live == live


@both_kinds
async def test_deletion_timestamp_means_deleting(ref: ModelRef) -> None:
    live = live_object(ref, UID, deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["x/y"])
    result = await confirm(scripted(ref, live), ref)
    assert result.outcome == Outcome.DELETING
    assert result.outcome.proves_absence
    assert result.live == live


@both_kinds
async def test_same_uid_alive_drops_the_rumour(ref: ModelRef) -> None:
    live = live_object(ref, UID)
    result = await confirm(scripted(ref, live), ref)
    assert result.outcome == Outcome.ALIVE_SAME_UID
    assert not result.outcome.proves_absence
    assert result.live == live


@both_kinds
async def test_unknown_recorded_uid_and_an_object_present_is_alive(ref: ModelRef) -> None:
    result = await confirm(scripted(ref, live_object(ref, OTHER_UID)), ref, uid="")
    assert result.outcome == Outcome.ALIVE_SAME_UID


@both_kinds
async def test_an_object_without_uid_never_confirms_a_known_uid(ref: ModelRef) -> None:
    result = await confirm(scripted(ref, live_object(ref, uid=None)), ref, uid=UID)
    assert result.outcome == Outcome.ALIVE_SAME_UID


@both_kinds
@pytest.mark.parametrize(
    "error",
    [
        pytest.param(status_error(500, "InternalError", "etcdserver: request timed out"), id="500"),
        pytest.param(status_error(503, "ServiceUnavailable"), id="503"),
        pytest.param(
            ApiError(
                429, {"kind": "Status", "reason": "TooManyRequests", "details": {"retryAfterSeconds": 1}}, "GET", "/"
            ),
            id="429",
        ),
        pytest.param(status_error(401, "Unauthorized"), id="401"),
        pytest.param(status_error(403, "Forbidden", 'cannot get resource "clusterbasemodels"'), id="403"),
        pytest.param(ApiUnavailable("GET /x: ClientConnectorError: connection refused"), id="connection-error"),
        pytest.param(ApiUnavailable("GET /x: no answer within 10s"), id="client-deadline"),
    ],
)
async def test_read_failures_are_unknown_and_requeued(ref: ModelRef, error: Exception) -> None:
    result = await confirm(scripted(ref, error), ref)
    assert result.outcome == Outcome.READ_FAILED
    assert result.outcome.value == "read_failed_requeued"
    assert not result.outcome.proves_absence
    assert result.live is None
    assert result.detail


@both_kinds
async def test_a_read_that_fails_twice_then_succeeds(ref: ModelRef) -> None:
    client = scripted(
        ref,
        status_error(503, "ServiceUnavailable"),
        ApiUnavailable("connection reset"),
        not_found(ref.name, PLURALS[ref]),
    )
    outcomes = [(await confirm(client, ref)).outcome for _ in range(3)]
    assert outcomes == [Outcome.READ_FAILED, Outcome.READ_FAILED, Outcome.CONFIRMED_GONE]
    assert [(c.method, c.path) for c in client.calls] == [("GET", PATHS[ref])] * 3


# ------------------------------------------------------------------------------ deadline and shutdown


@both_kinds
async def test_a_read_that_never_answers_is_bounded_by_the_deadline(ref: ModelRef) -> None:
    never = asyncio.Event()

    async def hang() -> dict[str, Any]:
        await never.wait()
        raise AssertionError("unreachable")

    client = scripted(ref, hang)
    started = time.monotonic()
    result = await asyncio.wait_for(
        confirm_absence(client, ref, UID, deadline_s=0.2),  # type: ignore[arg-type]
        5.0,
    )
    elapsed = time.monotonic() - started
    assert result.outcome == Outcome.READ_FAILED
    assert elapsed < 2.0


@both_kinds
async def test_cancelling_during_the_read_propagates_promptly(ref: ModelRef) -> None:
    entered = asyncio.Event()
    never = asyncio.Event()
    reached_end = False

    async def hang() -> dict[str, Any]:
        nonlocal reached_end
        entered.set()
        await never.wait()
        reached_end = True
        return live_object(ref)

    client = scripted(ref, hang)
    task = asyncio.get_running_loop().create_task(confirm_absence(client, ref, UID, deadline_s=30.0))  # type: ignore[arg-type]
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)
    assert task.cancelled()
    assert time.monotonic() - started < 1.0
    assert not reached_end


# ------------------------------------------------------------------------------- coalesced (Confirmer)

LIST_PATH = "/apis/ome.io/v1beta1/clusterbasemodels"


def cbm_ref(i: int) -> ModelRef:
    return ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", f"m{i}")


def listing(*refs: ModelRef) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "9"}, "items": [live_object(r) for r in refs]}


def confirmer(client: FakeKubeClient, threshold: int = 3) -> Confirmer:
    return Confirmer(client, batch_threshold=threshold, debounce_s=0.0, jitter_s=0.0)  # type: ignore[arg-type]


async def test_one_list_decides_a_storm_carried_by_few_workers() -> None:
    """Candidates confirmed in waves (as a few workers carry them) after one burst of events share one LIST."""
    refs = [cbm_ref(i) for i in range(12)]
    client = FakeKubeClient()
    client.always("GET", LIST_PATH, listing(*refs))
    c = confirmer(client)
    for r in refs:
        c.heard(r.key)  # the burst: every object rumoured deleted
    for wave in (refs[0:4], refs[4:8], refs[8:12]):  # four workers at a time
        outcomes = await asyncio.wait_for(asyncio.gather(*(c.confirm(r, UID) for r in wave)), DEADLINE_S)
        assert {o.outcome for o in outcomes} == {Outcome.ALIVE_SAME_UID}
    assert len(client.calls_to("GET", LIST_PATH)) == 1
    assert [call.path for call in client.calls if call.path != LIST_PATH] == []


async def test_an_event_after_the_list_started_needs_a_new_read() -> None:
    refs = [cbm_ref(i) for i in range(5)]
    client = FakeKubeClient()
    client.script("GET", LIST_PATH, listing(*refs), listing(*refs[1:]))
    client.script("GET", "/apis/ome.io/v1beta1/clusterbasemodels/m0", not_found("m0", "clusterbasemodels"))
    c = confirmer(client)
    for r in refs:
        c.heard(r.key)
    await asyncio.wait_for(asyncio.gather(*(c.confirm(r, UID) for r in refs)), DEADLINE_S)
    c.heard(refs[0].key)  # a newer rumour (m0 really deleted now): the LIST above cannot speak for it
    outcome = await asyncio.wait_for(c.confirm(refs[0], UID), DEADLINE_S)
    assert outcome.outcome == Outcome.CONFIRMED_GONE
    assert len(client.calls_to("GET", LIST_PATH)) == 2  # a new LIST (storm window), then the object's own GET


async def test_a_candidate_nobody_heard_of_is_never_decided_by_an_earlier_list() -> None:
    refs = [cbm_ref(i) for i in range(5)]
    client = FakeKubeClient()
    client.always("GET", LIST_PATH, listing(*refs))
    c = confirmer(client)
    for r in refs:
        c.heard(r.key)
    await asyncio.wait_for(asyncio.gather(*(c.confirm(r, UID) for r in refs)), DEADLINE_S)
    stranger = cbm_ref(99)  # e.g. a record on disk found by a drift pass, no event about it
    client.script("GET", "/apis/ome.io/v1beta1/clusterbasemodels/m99", live_object(stranger))
    outcome = await asyncio.wait_for(c.confirm(stranger, UID), DEADLINE_S)
    assert outcome.outcome == Outcome.ALIVE_SAME_UID
    assert len(client.calls_to("GET", "/apis/ome.io/v1beta1/clusterbasemodels/m99")) == 1


async def test_absence_in_a_reused_list_is_still_proven_by_the_objects_own_read() -> None:
    refs = [cbm_ref(i) for i in range(6)]
    client = FakeKubeClient()
    client.always("GET", LIST_PATH, listing(*refs[:5]))  # m5 missing from the LIST (dropped or deleted)
    client.always("GET", "/apis/ome.io/v1beta1/clusterbasemodels/m5", live_object(refs[5]))
    c = confirmer(client)
    for r in refs:
        c.heard(r.key)
    await asyncio.wait_for(asyncio.gather(*(c.confirm(r, UID) for r in refs[:4])), DEADLINE_S)
    outcome = await asyncio.wait_for(c.confirm(refs[5], UID), DEADLINE_S)  # decided from the reused LIST
    assert outcome.outcome == Outcome.ALIVE_SAME_UID  # the GET found it: nothing is removed
    assert len(client.calls_to("GET", LIST_PATH)) == 1


async def test_a_failed_list_confirms_nothing_and_is_not_reused() -> None:
    refs = [cbm_ref(i) for i in range(5)]
    client = FakeKubeClient()
    client.script("GET", LIST_PATH, ApiUnavailable("connection refused"))
    client.always("GET", LIST_PATH, listing(*refs))
    c = confirmer(client)
    for r in refs:
        c.heard(r.key)
    first = await asyncio.wait_for(asyncio.gather(*(c.confirm(r, UID) for r in refs[:4])), DEADLINE_S)
    assert {o.outcome for o in first} == {Outcome.READ_FAILED}
    again = await asyncio.wait_for(asyncio.gather(*(c.confirm(r, UID) for r in refs)), DEADLINE_S)
    assert {o.outcome for o in again} == {Outcome.ALIVE_SAME_UID}
    assert len(client.calls_to("GET", LIST_PATH)) == 2


async def test_a_delete_heard_while_the_lists_absent_items_are_read_is_not_answered_alive() -> None:
    """the LIST shows X; while the GETs for the items it lacks are slow, X is really deleted
    and its DELETED heard. X's waiter must not get ``alive`` from the older LIST: X is read again."""
    x, others = cbm_ref(0), [cbm_ref(i) for i in range(1, 4)]
    client = FakeKubeClient()
    client.always("GET", LIST_PATH, listing(x))  # the others are missing from this LIST: each gets a GET
    gets_started = asyncio.Event()
    release = asyncio.Event()

    def slow_alive(ref: ModelRef) -> Any:
        async def answer() -> dict[str, Any]:
            gets_started.set()
            await release.wait()
            return live_object(ref)

        return answer

    for r in others:
        client.script("GET", f"{LIST_PATH}/{r.name}", slow_alive(r))
    client.script("GET", f"{LIST_PATH}/{x.name}", not_found(x.name, "clusterbasemodels"))
    c = confirmer(client)
    for r in (x, *others):
        c.heard(r.key)
    pending = asyncio.gather(*(c.confirm(r, UID) for r in (x, *others)))
    await asyncio.wait_for(gets_started.wait(), DEADLINE_S)
    c.heard(x.key)  # X's real DELETED arrives while the LIST's answers wait for the slow GETs
    release.set()
    outcomes = await asyncio.wait_for(pending, DEADLINE_S)
    assert outcomes[0].outcome == Outcome.CONFIRMED_GONE
    assert {o.outcome for o in outcomes[1:]} == {Outcome.ALIVE_SAME_UID}
    assert len(client.calls_to("GET", f"{LIST_PATH}/{x.name}")) == 1
    assert all(o.read_at is not None for o in outcomes)


async def test_a_joined_list_cannot_answer_alive_for_a_delete_heard_while_it_ran() -> None:
    refs = [cbm_ref(i) for i in range(5)]
    listed = asyncio.Event()
    release = asyncio.Event()

    async def slow_list() -> dict[str, Any]:
        listed.set()
        await release.wait()
        return listing(*refs)

    client = FakeKubeClient()
    client.script("GET", LIST_PATH, slow_list)
    client.script("GET", f"{LIST_PATH}/m4", not_found("m4", "clusterbasemodels"))
    c = confirmer(client)
    for r in refs:
        c.heard(r.key)
    storm = asyncio.gather(*(c.confirm(r, UID) for r in refs[:4]))
    await asyncio.wait_for(listed.wait(), DEADLINE_S)
    joiner = asyncio.ensure_future(c.confirm(refs[4], UID))  # joins the LIST in flight
    await asyncio.sleep(0)
    c.heard(refs[4].key)  # then m4's real DELETED is heard before the LIST answers
    release.set()
    assert {o.outcome for o in await asyncio.wait_for(storm, DEADLINE_S)} == {Outcome.ALIVE_SAME_UID}
    assert (await asyncio.wait_for(joiner, DEADLINE_S)).outcome == Outcome.CONFIRMED_GONE


async def test_a_get_confirmation_carries_when_its_read_started() -> None:
    client = scripted(CLUSTER, live_object(CLUSTER))
    before = time.monotonic()
    result = await confirm(client, CLUSTER)
    assert result.read_at is not None and before <= result.read_at <= time.monotonic()


async def test_a_relist_while_the_lists_answers_wait_sends_alive_answers_to_their_own_get() -> None:
    # X was deleted while no watch was open; the cache's next relist lacks it but, having already lost X,
    # produces no event for it. The relist is news of every object of the kind: the older LIST cannot prove X.
    x, others = cbm_ref(0), [cbm_ref(i) for i in range(1, 4)]
    client = FakeKubeClient()
    client.always("GET", LIST_PATH, listing(x))
    gets_started = asyncio.Event()
    release = asyncio.Event()

    def slow(ref: ModelRef) -> Any:
        async def answer() -> dict[str, Any]:
            gets_started.set()
            await release.wait()
            return live_object(ref)

        return answer

    for r in others:
        client.script("GET", f"{LIST_PATH}/{r.name}", slow(r))
    client.script("GET", f"{LIST_PATH}/{x.name}", not_found(x.name, "clusterbasemodels"))
    c = confirmer(client)
    for r in (x, *others):
        c.heard(r.key)
    pending = asyncio.gather(*(c.confirm(r, UID) for r in (x, *others)))
    await asyncio.wait_for(gets_started.wait(), DEADLINE_S)
    c.relisted(x.kind.value)
    release.set()
    outcomes = await asyncio.wait_for(pending, DEADLINE_S)
    assert outcomes[0].outcome == Outcome.CONFIRMED_GONE
    assert {o.outcome for o in outcomes[1:]} == {Outcome.ALIVE_SAME_UID}  # proven by their own GETs
