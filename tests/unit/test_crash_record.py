"""Durable attempt records (agent/crash_record.py): the decision as a table, and the records across "processes".

A new :class:`CrashRecords` on the same directory is what a restarted agent sees; a step left open by the
previous instance is what the kernel's kill leaves behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_agent.agent.crash_record import (
    CRASH_LIMIT,
    Attempt,
    CrashRecords,
    Step,
    begun,
    crashes_seen,
    judge,
    spec_of,
)
from tests.support.hostile_json import DEEP, NOT_OBJECTS

SPEC = spec_of("uid-1", 3)
KEY = "BaseModel/team-evil/bomb"


@pytest.mark.parametrize(
    ("record", "spec", "quarantined"),
    [
        (None, SPEC, False),  # never began a risky step
        (Attempt(KEY, SPEC, 0), SPEC, False),
        (Attempt(KEY, SPEC, CRASH_LIMIT - 1), SPEC, False),  # one more try
        (Attempt(KEY, SPEC, CRASH_LIMIT), SPEC, True),
        (Attempt(KEY, SPEC, CRASH_LIMIT + 5), SPEC, True),
        (Attempt(KEY, SPEC, CRASH_LIMIT), spec_of("uid-1", 4), False),  # the spec changed: tried again
        (Attempt(KEY, SPEC, CRASH_LIMIT), spec_of("uid-2", 3), False),  # deleted and created again
    ],
)
def test_judge(record: Attempt | None, spec: str, quarantined: bool) -> None:
    verdict = judge(record, spec, CRASH_LIMIT, "listing")
    assert verdict.quarantined is quarantined
    if quarantined:
        assert "listing" in verdict.message and f"{CRASH_LIMIT} times" in verdict.message
        assert "until its spec changes" in verdict.message


@pytest.mark.parametrize(
    ("record", "counted"),
    [
        (Attempt(KEY, SPEC, 0, ""), 0),  # closed: the process survived the step
        (Attempt(KEY, SPEC, 0, "listing", 1.0), 1),  # left open: the process died during it
        (Attempt(KEY, SPEC, 2, "metadata", 1.0), 3),
    ],
)
def test_an_open_step_is_a_crash(record: Attempt, counted: int) -> None:
    seen = crashes_seen(record)
    assert (seen.crashes, seen.open_step) == (counted, "")


@pytest.mark.parametrize(
    ("record", "spec", "crashes"),
    [
        (None, SPEC, 0),
        (Attempt(KEY, SPEC, 2), SPEC, 2),  # the same spec keeps its crashes, whatever step
        (Attempt(KEY, SPEC, 2), spec_of("uid-1", 4), 0),  # another spec's crashes are dropped
    ],
)
def test_begun(record: Attempt | None, spec: str, crashes: int) -> None:
    new = begun(record, KEY, spec, Step.METADATA, 5.0)
    assert (new.spec, new.crashes, new.open_step, new.started_at) == (spec, crashes, "metadata", 5.0)


def test_deaths_during_steps_quarantine_after_the_limit(tmp_path: Path) -> None:
    directory = tmp_path / "attempts"
    for death in range(CRASH_LIMIT):
        agent = CrashRecords(directory)
        assert not agent.verdict(KEY, "uid-1", 3).quarantined, death
        agent.begin(KEY, "uid-1", 3, Step.LISTING)  # ... and the process dies here (no end)
    restarted = CrashRecords(directory)
    verdict = restarted.verdict(KEY, "uid-1", 3)
    assert verdict.quarantined
    assert "listing" in verdict.message
    # Another restart says the same: the record is stable while nothing runs the step.
    assert CrashRecords(directory).verdict(KEY, "uid-1", 3).quarantined
    # A changed spec is tried again, from zero.
    assert not CrashRecords(directory).verdict(KEY, "uid-1", 4).quarantined


def test_a_step_that_ends_is_no_crash_and_does_not_wipe_earlier_ones(tmp_path: Path) -> None:
    directory = tmp_path / "attempts"
    agent = CrashRecords(directory)
    agent.begin(KEY, "uid-1", 3, Step.LISTING)
    agent.end(KEY)  # survived: nothing is left on disk
    assert list(directory.glob("*.json")) == []
    assert CrashRecords(directory).get(KEY) is None

    # Died in the metadata step; the next process lists fine (closes that step) and dies in metadata again:
    # the listing's success must not reset the count, or the loop would never end.
    CrashRecords(directory).begin(KEY, "uid-1", 3, Step.METADATA)
    for _ in range(CRASH_LIMIT - 1):
        agent = CrashRecords(directory)
        agent.begin(KEY, "uid-1", 3, Step.LISTING)
        agent.end(KEY)
        agent.begin(KEY, "uid-1", 3, Step.METADATA)
    assert CrashRecords(directory).verdict(KEY, "uid-1", 3).quarantined


def test_finished_and_forget_drop_the_record(tmp_path: Path) -> None:
    directory = tmp_path / "attempts"
    CrashRecords(directory).begin(KEY, "uid-1", 3, Step.LISTING)
    agent = CrashRecords(directory)
    assert agent.get(KEY) == Attempt(KEY, SPEC, 1)
    agent.begin(KEY, "uid-1", 3, Step.METADATA)
    agent.end(KEY)
    assert json.loads(next(directory.glob("*.json")).read_text())["crashes"] == 1  # kept while unfinished
    agent.finished(KEY)
    assert list(directory.glob("*.json")) == []
    CrashRecords(directory).begin(KEY, "uid-1", 3, Step.LISTING)
    other = CrashRecords(directory)
    other.forget(KEY)
    assert CrashRecords(directory).get(KEY) is None


def test_a_garbled_record_quarantines_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "attempts"
    directory.mkdir()
    (directory / "x.json").write_text("{not json")
    (directory / "y.json").write_text(json.dumps({"spec": SPEC, "crashes": 99}))  # no key
    agent = CrashRecords(directory)
    assert not agent.verdict(KEY, "uid-1", 3).quarantined
    agent.begin(KEY, "uid-1", 3, Step.LISTING)
    agent.end(KEY)


@pytest.mark.parametrize(
    "text",
    [
        *NOT_OBJECTS,
        json.dumps({"key": KEY, "spec": SPEC, "crashes": []}),
        json.dumps({"key": KEY, "spec": SPEC, "crashes": 0})[:-2] + "1e999}",  # int(inf)
        json.dumps({"key": KEY, "spec": SPEC, "crashes": 5, "started_at": 10**400}),  # float(10**400)
        DEEP,
    ],
    ids=["list", "number", "string", "null", "crashes a list", "crashes infinite", "started_at huge", "deep"],
)
def test_a_record_of_the_wrong_shape_reads_as_absent(tmp_path: Path, text: str) -> None:
    directory = tmp_path / "attempts"
    directory.mkdir()
    (directory / "x.json").write_text(text)
    agent = CrashRecords(directory)
    assert agent.get(KEY) is None
    assert not agent.verdict(KEY, "uid-1", 3).quarantined
