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
    MAX_PROBATION_S,
    PROBATION_S,
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


NOW = 1_000_000.0


def _crashed(crashes: int, ago: float) -> Attempt:
    return Attempt(KEY, SPEC, crashes, crashed_at=NOW - ago)


@pytest.mark.parametrize(
    ("record", "spec", "quarantined", "retry_in"),
    [
        (None, SPEC, False, 0.0),  # never began a risky step
        (Attempt(KEY, SPEC, 0), SPEC, False, 0.0),
        (_crashed(CRASH_LIMIT - 1, 0), SPEC, False, 0.0),  # one more try
        (_crashed(CRASH_LIMIT, 0), SPEC, True, PROBATION_S),
        (_crashed(CRASH_LIMIT, PROBATION_S - 1), SPEC, True, 1.0),
        (_crashed(CRASH_LIMIT, PROBATION_S), SPEC, False, 0.0),  # probation: tried again, alone of its spec
        (_crashed(CRASH_LIMIT + 1, PROBATION_S), SPEC, True, PROBATION_S),  # died again: twice as long
        (_crashed(CRASH_LIMIT + 5, 0), SPEC, True, 32 * PROBATION_S),
        (_crashed(CRASH_LIMIT + 40, 0), SPEC, True, MAX_PROBATION_S),  # never longer than the cap
        (_crashed(CRASH_LIMIT + 40, MAX_PROBATION_S), SPEC, False, 0.0),  # and never for good
        (_crashed(CRASH_LIMIT, 0), spec_of("uid-1", 4), False, 0.0),  # the spec changed: tried again
        (_crashed(CRASH_LIMIT, 0), spec_of("uid-2", 3), False, 0.0),  # deleted and created again
    ],
)
def test_judge(record: Attempt | None, spec: str, quarantined: bool, retry_in: float) -> None:
    verdict = judge(record, spec, CRASH_LIMIT, "listing", NOW)
    assert verdict.quarantined is quarantined
    assert verdict.retry_in_s == pytest.approx(retry_in)
    if quarantined:
        assert "listing" in verdict.message and "times" in verdict.message
        assert "tried again in" in verdict.message


@pytest.mark.parametrize(
    ("record", "counted", "crashed_at"),
    [
        (Attempt(KEY, SPEC, 0, ""), 0, 0.0),  # closed: the process survived the step
        (Attempt(KEY, SPEC, 0, "listing", 1.0), 1, NOW),  # left open: the process died during it
        (Attempt(KEY, SPEC, 2, "metadata", 1.0, 5.0), 3, NOW),
    ],
)
def test_an_open_step_is_a_crash(record: Attempt, counted: int, crashed_at: float) -> None:
    seen = crashes_seen(record, NOW)
    assert (seen.crashes, seen.open_step, seen.crashed_at) == (counted, "", crashed_at)


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
    record = agent.get(KEY)
    assert record is not None and (record.crashes, record.open_step) == (1, "")
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


def test_a_healthy_model_charged_with_three_deaths_comes_back_after_its_probation(tmp_path: Path) -> None:
    """Three kills during its listing (a liveness probe, an OOM of another model, a drain): quarantined for the
    probation, then its steps run again; completing them clears the record for good."""
    directory = tmp_path / "attempts"
    for _ in range(CRASH_LIMIT):
        CrashRecords(directory).begin(KEY, "uid-1", 3, Step.LISTING)  # ... killed
    agent = CrashRecords(directory)
    verdict = agent.verdict(KEY, "uid-1", 3)
    assert verdict.quarantined and 0 < verdict.retry_in_s <= PROBATION_S
    record = agent.get(KEY)
    assert record is not None
    # The probation is over (the crash counted PROBATION_S ago, as a later process reads it from disk).
    stamped = json.loads(next(directory.glob("*.json")).read_text())
    stamped["crashed_at"] -= PROBATION_S + 1
    next(directory.glob("*.json")).write_text(json.dumps(stamped))
    later = CrashRecords(directory)
    assert not later.verdict(KEY, "uid-1", 3).quarantined
    later.begin(KEY, "uid-1", 3, Step.LISTING)
    later.end(KEY)
    later.finished(KEY)  # its manifest was saved: healthy
    assert CrashRecords(directory).get(KEY) is None


def test_a_temporary_record_left_by_a_kill_is_removed(tmp_path: Path) -> None:
    directory = tmp_path / "attempts"
    directory.mkdir()
    leftover = directory / ".abc.json.node-1.77.tmp"
    leftover.write_text("{")
    assert CrashRecords(directory).get(KEY) is None
    assert not leftover.exists()
