"""Unit tests for :func:`model_agent.agent.converge.decide`: one test per row of its table, plus the rules
that cut across rows (an obsolete job is cancelled everywhere; the old copy is retired only after the new
target is Ready, and kept when it cannot be made Ready)."""

from __future__ import annotations

import pytest

from model_agent.agent.converge import (
    Act,
    Decision,
    Facts,
    FailureFact,
    JobFact,
    LocalDir,
    ManifestFact,
    TargetKind,
    decide,
)

FETCHED = TargetKind.FETCHED


# ----------------------------------------------------------------------------------------------- rows


def test_intact_manifest_of_the_target_is_ready_and_staging_no_job_owns_is_cleaned() -> None:
    assert decide(Facts(ManifestFact.INTACT, FETCHED)) == Decision(Act.READY, clean_staging=True)


def test_intact_manifest_while_its_own_job_finishes_is_ready_and_keeps_staging() -> None:
    got = decide(Facts(ManifestFact.INTACT, FETCHED, job=JobFact.THIS_TARGET))
    assert got == Decision(Act.READY)


def test_spec_reverted_to_an_intact_copy_cancels_the_obsolete_job_and_cleans_its_staging() -> None:
    got = decide(Facts(ManifestFact.INTACT, FETCHED, job=JobFact.OTHER_TARGET))
    assert got == Decision(Act.READY, cancel_job=True, clean_staging=True)


def test_local_target_whose_directory_is_missing_fails_and_keeps_the_old_copy() -> None:
    got = decide(Facts(ManifestFact.SUPERSEDED, TargetKind.LOCAL, LocalDir.MISSING))
    assert got.act == Act.FAIL_LOCAL and got.reason == "LocalPathNotFound"
    assert not got.retire_superseded  # the copy the spec may come back to stays where it is


def test_adopted_local_directory_that_vanished_fails() -> None:
    got = decide(Facts(ManifestFact.DAMAGED, TargetKind.LOCAL, LocalDir.MISSING))
    assert got == Decision(Act.FAIL_LOCAL, "LocalPathNotFound", clean_staging=True)


def test_adopted_local_directory_that_lost_recorded_files_fails() -> None:
    got = decide(Facts(ManifestFact.DAMAGED, TargetKind.LOCAL, LocalDir.FILES_MISSING))
    assert got == Decision(Act.FAIL_LOCAL, "LocalFilesChanged", clean_staging=True)


def test_local_directory_whose_files_were_only_modified_is_adopted_again() -> None:
    got = decide(Facts(ManifestFact.DAMAGED, TargetKind.LOCAL, LocalDir.PRESENT))
    assert got == Decision(Act.ADOPT, clean_staging=True)


def test_new_local_directory_is_adopted() -> None:
    assert decide(Facts(ManifestFact.NONE, TargetKind.LOCAL, LocalDir.PRESENT)) == Decision(
        Act.ADOPT, clean_staging=True
    )


def test_switch_to_an_existing_local_directory_adopts_it_then_retires_the_old_copy() -> None:
    got = decide(Facts(ManifestFact.SUPERSEDED, TargetKind.LOCAL, LocalDir.PRESENT, job=JobFact.OTHER_TARGET))
    assert got == Decision(Act.ADOPT, cancel_job=True, retire_superseded=True, clean_staging=True, superseded=True)


def test_vendor_target_is_adopted() -> None:
    got = decide(Facts(ManifestFact.SUPERSEDED, TargetKind.VENDOR))
    assert got == Decision(Act.ADOPT, retire_superseded=True, clean_staging=True, superseded=True)


def test_copy_in_the_trash_is_restored_beating_a_running_download_then_the_old_copy_is_retired() -> None:
    got = decide(Facts(ManifestFact.SUPERSEDED, FETCHED, restorable=True, job=JobFact.THIS_TARGET))
    assert got == Decision(Act.RESTORE, cancel_job=True, retire_superseded=True, clean_staging=True, superseded=True)


def test_restore_with_nothing_superseded_retires_nothing() -> None:
    got = decide(Facts(ManifestFact.NONE, FETCHED, restorable=True))
    assert got == Decision(Act.RESTORE, clean_staging=True)


def test_unsupported_source_fails() -> None:
    got = decide(Facts(ManifestFact.NONE, TargetKind.UNSUPPORTED))
    assert got == Decision(Act.UNSUPPORTED)


def test_running_fetch_of_the_target_is_waited_for() -> None:
    got = decide(Facts(ManifestFact.SUPERSEDED, FETCHED, job=JobFact.THIS_TARGET))
    assert got == Decision(Act.WAIT, superseded=True)


def test_deferred_switch_waits_as_updating_not_failed() -> None:
    got = decide(Facts(ManifestFact.SUPERSEDED, FETCHED, failure=FailureFact.SWITCH_DEFERRED))
    assert got == Decision(Act.WAIT, superseded=True)


@pytest.mark.parametrize("failure", [FailureFact.BACKING_OFF, FailureFact.FINAL])
def test_fetch_failure_not_due_for_retry_is_shown(failure: FailureFact) -> None:
    assert decide(Facts(ManifestFact.NONE, FETCHED, failure=failure)) == Decision(Act.FAIL)


@pytest.mark.parametrize("failure", [FailureFact.NONE, FailureFact.RETRY_DUE])
def test_otherwise_fetch_and_let_the_job_retire_the_old_copy(failure: FailureFact) -> None:
    got = decide(Facts(ManifestFact.SUPERSEDED, FETCHED, failure=failure, job=JobFact.OTHER_TARGET))
    assert got == Decision(Act.FETCH, cancel_job=True, superseded=True)


# ------------------------------------------------------------------------------------- cross-cutting rules

ALL_FACTS = [
    Facts(manifest, kind, local, restorable, job, failure)
    for manifest in ManifestFact
    for kind in TargetKind
    for local in (LocalDir if kind == TargetKind.LOCAL else [LocalDir.NOT_LOCAL])
    for restorable in (False, True)
    for job in JobFact
    for failure in FailureFact
]


def test_an_obsolete_job_is_cancelled_in_every_row() -> None:
    for facts in ALL_FACTS:
        if facts.job == JobFact.OTHER_TARGET:
            assert decide(facts).cancel_job, facts


def test_the_old_copy_is_retired_only_by_acts_that_made_the_new_target_ready_first() -> None:
    for facts in ALL_FACTS:
        got = decide(facts)
        if got.retire_superseded:
            assert got.act in (Act.ADOPT, Act.RESTORE), facts
            assert facts.manifest == ManifestFact.SUPERSEDED, facts
        if facts.manifest == ManifestFact.SUPERSEDED and got.act != Act.FETCH and not got.retire_superseded:
            assert got.superseded, facts  # kept as the record of the copy still in place


def test_staging_is_never_cleaned_under_a_running_job_of_the_target() -> None:
    for facts in ALL_FACTS:
        got = decide(facts)
        if got.clean_staging and facts.job == JobFact.THIS_TARGET:
            assert got.cancel_job, facts  # only a restore, which cancels the download first


def test_nothing_intact_is_ever_fetched_again() -> None:
    for facts in ALL_FACTS:
        if facts.manifest == ManifestFact.INTACT:
            assert decide(facts).act == Act.READY, facts
