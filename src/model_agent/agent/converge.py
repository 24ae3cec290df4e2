"""The converge decision: for a model wanted on this node, what to do next — as data, from facts.

:func:`decide` is pure: the reconciler gathers :class:`Facts` for one key (its manifest against the wanted
target, the local directory, the trash, the fetcher) and carries out the :class:`Decision` it returns. The
rules that keep weights safe during a change of spec live here, in one table:

* the old copy of a model (a *superseded* manifest) is retired only after the new target is Ready — a
  ``local://`` directory that exists and was recorded, a copy restored from the trash, or a fetch that is
  complete and verified in staging (the fetch job retires the old copy itself, just before it publishes);
  when the new target cannot be made Ready the old copy and its manifest stay where they are, so patching
  the spec back makes it Ready again with no download;
* a fetch job for another target than the wanted one is obsolete: it is cancelled, and staging that no
  running job owns is cleaned whenever the decision does not fetch;
* a ``local://`` directory that vanished, or lost files it had when it was recorded, is ``Failed``.

=========================================================  =================  ==================================
Facts (first matching row wins)                            Act                Also
=========================================================  =================  ==================================
manifest of the target, intact                             ``ready``          clean staging unless its job runs
local target, directory missing                            ``fail_local``     LocalPathNotFound; old copy kept
local target, recorded files missing                       ``fail_local``     LocalFilesChanged; old copy kept
local or vendor target (none / superseded / changed)       ``adopt``          retire the superseded copy after
copy in the trash, destination absent                      ``restore``        cancel any job; retire old after
source type not served by this agent                       ``unsupported``
fetch job for the target running                           ``wait``           show its progress
deferred source switch, retry not due yet                  ``wait``           requeue at the retry time
fetch failed, not retryable or retry not due               ``fail``           requeue at the retry time
otherwise                                                  ``fetch``          the job retires the old copy
=========================================================  =================  ==================================

A fetch job for another target is cancelled in every row (``cancel_job``): the wanted state changed. Staging
is cleaned (``clean_staging``) only where no job of the wanted target can be using it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from model_agent.model.reasons import Reason


class ManifestFact(StrEnum):
    """What the manifest on disk says about the wanted target."""

    NONE = "none"  # no record for this key
    INTACT = "intact"  # a record of the wanted target that passes the fast check
    DAMAGED = "damaged"  # a record of the wanted target whose files changed or went missing
    SUPERSEDED = "superseded"  # a record of another source or path: the old copy, still in place


class TargetKind(StrEnum):
    """What kind of target the spec names: one the agent downloads and owns, one it only reads, or neither."""

    FETCHED = "fetched"  # a source this agent downloads
    LOCAL = "local"  # local:// — read in place, never owned
    VENDOR = "vendor"  # vendor:// — nothing on disk to check
    UNSUPPORTED = "unsupported"  # a source type this agent cannot fetch


class LocalDir(StrEnum):
    """What a ``local://`` target's directory looks like now."""

    NOT_LOCAL = "not_local"
    MISSING = "missing"  # the directory is not there (or not a directory)
    PRESENT = "present"
    FILES_MISSING = "files_missing"  # there, but files recorded when it was adopted are gone


class JobFact(StrEnum):
    """Whether a fetch job runs for this key, and whether it is for the target the spec wants now."""

    NONE = "none"
    THIS_TARGET = "this_target"
    OTHER_TARGET = "other_target"  # obsolete: the spec changed since it started


class FailureFact(StrEnum):
    """The last fetch failure of this target, if any, and whether its retry is due."""

    NONE = "none"
    RETRY_DUE = "retry_due"
    BACKING_OFF = "backing_off"
    FINAL = "final"  # not retryable
    SWITCH_DEFERRED = "switch_deferred"  # the old copy could not be retired yet; retry not due


class Act(StrEnum):
    """The one thing the reconciler does next for a wanted model (the rows of the module's table)."""

    READY = "ready"
    FAIL_LOCAL = "fail_local"
    ADOPT = "adopt"
    RESTORE = "restore"
    UNSUPPORTED = "unsupported"
    WAIT = "wait"
    FAIL = "fail"
    FETCH = "fetch"


@dataclass(frozen=True)
class Facts:
    """Everything :func:`decide` may look at, gathered by the reconciler for one key at one instant."""

    manifest: ManifestFact
    kind: TargetKind
    local: LocalDir = LocalDir.NOT_LOCAL
    restorable: bool = False  # a trash entry of this source and path with its data, and the destination absent
    job: JobFact = JobFact.NONE
    failure: FailureFact = FailureFact.NONE


@dataclass(frozen=True)
class Decision:
    """:func:`decide`'s answer: the act and the clean-ups that go with it."""

    act: Act
    reason: str = ""  # the Failed reason for ``fail_local``
    cancel_job: bool = False  # cancel the running fetch job first (obsolete, or beaten by a restore)
    retire_superseded: bool = False  # after the act made the new target Ready, retire the old copy
    clean_staging: bool = False  # remove this key's staging (no job of the wanted target owns it)
    superseded: bool = False  # the manifest is the old copy's: hand it to the fetch, never publish it


def decide(facts: Facts) -> Decision:
    """The act for one wanted model; see the module's table."""
    obsolete = facts.job == JobFact.OTHER_TARGET
    idle = facts.job != JobFact.THIS_TARGET
    superseded = facts.manifest == ManifestFact.SUPERSEDED
    if facts.manifest == ManifestFact.INTACT:
        return Decision(Act.READY, cancel_job=obsolete, clean_staging=idle)
    if facts.kind == TargetKind.LOCAL and facts.local == LocalDir.MISSING:
        return Decision(
            Act.FAIL_LOCAL, Reason.LOCAL_PATH_NOT_FOUND, cancel_job=obsolete, clean_staging=idle, superseded=superseded
        )
    if (
        facts.kind == TargetKind.LOCAL
        and facts.local == LocalDir.FILES_MISSING
        and facts.manifest == ManifestFact.DAMAGED
    ):
        return Decision(Act.FAIL_LOCAL, Reason.LOCAL_FILES_CHANGED, cancel_job=obsolete, clean_staging=idle)
    if facts.kind in (TargetKind.LOCAL, TargetKind.VENDOR):
        return Decision(
            Act.ADOPT,
            cancel_job=obsolete,
            retire_superseded=superseded,
            clean_staging=idle,
            superseded=superseded,
        )
    if facts.restorable:
        return Decision(
            Act.RESTORE,
            cancel_job=facts.job != JobFact.NONE,
            retire_superseded=superseded,
            clean_staging=True,
            superseded=superseded,
        )
    if facts.kind == TargetKind.UNSUPPORTED:
        return Decision(Act.UNSUPPORTED, cancel_job=obsolete, superseded=superseded)
    if facts.job == JobFact.THIS_TARGET:
        return Decision(Act.WAIT, superseded=superseded)
    if facts.failure == FailureFact.SWITCH_DEFERRED:
        return Decision(Act.WAIT, cancel_job=obsolete, superseded=superseded)
    if facts.failure in (FailureFact.BACKING_OFF, FailureFact.FINAL):
        return Decision(Act.FAIL, cancel_job=obsolete, superseded=superseded)
    return Decision(Act.FETCH, cancel_job=obsolete, superseded=superseded)
