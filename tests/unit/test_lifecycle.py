"""The lifecycle table (agent/lifecycle.py): presence from the cached object, the gates, the lane."""

from __future__ import annotations

from typing import Any

import pytest

from model_agent.agent.lifecycle import Lane, Presence, Step, gate, lane, presence


def obj(uid: str = "u1", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "m", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("cached", "uid", "expected"),
    [
        (obj(), "u1", Presence.WANTED),
        (obj(), "", Presence.WANTED),  # no incarnation named: any UID
        (obj(uid=""), "u1", Presence.WANTED),  # an object without a UID (tests, old servers) is not another one
        (obj(deleting=True), "u1", Presence.DELETING),
        (obj(uid="u2", deleting=True), "u1", Presence.DELETING),  # deleting wins over the UID
        (None, "u1", Presence.ABSENT),
        (obj(uid="u2"), "u1", Presence.REPLACED),
    ],
)
def test_presence(cached: dict[str, Any] | None, uid: str, expected: Presence) -> None:
    assert presence(cached, uid) == expected


# The module's table, row by row: presence -> (lane, start download, write Ready, write Updating).
TABLE = {
    Presence.WANTED: (Lane.NORMAL, True, True, True),
    Presence.DELETING: (Lane.URGENT, False, False, False),
    Presence.ABSENT: (Lane.URGENT, False, False, False),
    Presence.REPLACED: (Lane.NORMAL, False, False, False),
}


@pytest.mark.parametrize("now", list(Presence))
def test_every_presence_has_its_row(now: Presence) -> None:
    expected_lane, download, ready, updating = TABLE[now]
    assert lane(now) == expected_lane
    assert gate(Step.START_DOWNLOAD, now) is download
    assert gate(Step.WRITE_READY, now) is ready
    assert gate(Step.WRITE_UPDATING, now) is updating


def test_every_step_is_in_the_table() -> None:
    assert all(gate(step, Presence.WANTED) for step in Step)  # a KeyError here is a step without a column
