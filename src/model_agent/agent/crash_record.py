"""Durable attempt records: a model whose processing killed the agent is not retried in a loop.

Role: some steps of processing one model run inside the agent's own process on input a tenant controls — the
listing of an object store (until the first byte is planned), and the listing and metadata parse of a
directory after publish or adoption. They are bounded (``sources/listing.py``, ``local/metadata_files.py``), but a
bound that proves too generous, or a bug, can still take the process past its memory limit. The kernel then
kills the agent with no chance to remember why; failures kept in memory are forgotten; the restarted agent
reconciles the same model, runs the same step and dies again — on every node the model selects.

Contract:

* before a risky step the reconciler calls :meth:`CrashRecords.begin` (the record says *this step of this
  model's spec is running*); when the step ends in any way the process survives — success, an error, a
  cancellation on shutdown — it calls :meth:`CrashRecords.end` (the step is closed). Only a process that died
  during the step leaves the step open; the next process reads it as one crash (:func:`crashes_seen`);
* the count belongs to one spec — the model's UID and ``metadata.generation`` — so a step that finished once
  does not wipe the crashes of the other step, and a model whose spec changes starts from zero;
* :func:`judge` is the decision, a pure function of the record, the spec and the time: with
  :data:`CRASH_LIMIT` or more crashes of this spec the model is quarantined — ``Failed`` with reason
  :data:`QUARANTINED`, an Event and a log line — for a probation period that starts when the last crash was
  counted, :data:`PROBATION_S` doubled for each crash past the limit, at most :data:`MAX_PROBATION_S`. Then
  its steps run once more: a model that completes is healthy again (its record is dropped); one that kills
  the agent again waits twice as long. No quarantine is for good: a death the model did not cause (a
  liveness-probe kill, an OOM caused by another model, a drain, a node losing power) can charge a healthy
  model's open step, and such a model must come back by itself; a model that really kills the agent costs
  each node one restart per probation period, a period that grows to hours. A spec change (or deleting the
  record) starts from zero at once;
* :meth:`CrashRecords.finished` drops the record once the model's processing completed (its manifest is
  saved), and :meth:`CrashRecords.forget` once nothing of the model is left on the node;
* records are small JSON files under the primary root's records area, one directory per node
  (``attempts/<node>/``: on a shared root that area is every node's, and another node's open step is not this
  node's crash), written atomically (temp file, fsync, rename, fsync of the directory) like manifests. This
  process is the only writer of its directory: a temporary file a kill left between write and rename is
  removed when the records are read. A garbled record reads as absent: an unreadable record must not
  quarantine anything.

Why :data:`CRASH_LIMIT` is 3, not 1: an unfinished step is not proof against the model. A SIGTERM closes the
step (the fetch is cancelled and ``end`` runs), but the kernel's OOM killer picks the process, not the model
— with two download workers, another model's step running at the same moment dies too — and a node losing
power or a SIGKILL after the grace period ends steps as well. Three consecutive deaths during a step of the
same spec is a pattern; an innocent model that merely shared one crash with the culprit keeps two more tries.
Each crash costs the whole node's agent a restart (with the kubelet's growing back-off), so more than a few
would let one object keep every node's agent down for minutes.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import structlog

from model_agent.local.layout import token_for
from model_agent.local.manifest import fsync_dir, write_atomic
from model_agent.model import json_text
from model_agent.model.reasons import Reason

log = structlog.get_logger(__name__)

CRASH_LIMIT = 3
"""Deaths of the agent during a step of one spec after which the model is quarantined (see the module doc)."""
PROBATION_S = 60.0
"""The first quarantine's length; each further crash of the same spec doubles it."""
MAX_PROBATION_S = 6 * 3600.0
"""The longest quarantine: a model that really kills the agent costs a node at most one restart per this."""
QUARANTINED = Reason.QUARANTINED_AFTER_CRASH
"""The reason of a quarantined model's ``Failed`` entry and Warning Event."""


class Step(StrEnum):
    LISTING = "listing"  # an object store's listing, before the first byte is planned
    METADATA = "metadata"  # listing and parsing a directory's files after publish or adoption


@dataclass(frozen=True)
class Attempt:
    """What the records area says about one model key."""

    key: str
    spec: str  # "<uid>/<generation>": the spec the counts belong to
    crashes: int = 0  # deaths of the agent during a step of this spec, counted when a process read them
    open_step: str = ""  # the step running now, or left running by a process that died during it
    started_at: float = 0.0  # when open_step began (wall clock, for the operator)
    crashed_at: float = 0.0  # when the last crash was counted (wall clock): the probation starts there


def spec_of(uid: str, generation: int) -> str:
    """The identity of a model's spec the counts belong to: a new object or a changed spec starts from zero."""
    return f"{uid}/{generation}"


def crashes_seen(record: Attempt, now: float) -> Attempt:
    """A record as a new process reads it (at ``now``): a step left open means the process that ran it died
    during it."""
    if not record.open_step:
        return record
    return Attempt(record.key, record.spec, record.crashes + 1, "", 0.0, now)


def probation_s(crashes: int, limit: int = CRASH_LIMIT) -> float:
    """How long a model with ``crashes`` (at least ``limit``) stays quarantined after its last crash."""
    return min(MAX_PROBATION_S, PROBATION_S * 2.0 ** min(max(crashes - limit, 0), 32))


@dataclass(frozen=True)
class Verdict:
    quarantined: bool
    message: str = ""
    retry_in_s: float = 0.0  # while quarantined: when the probation ends and the steps run once more


def judge(
    record: Attempt | None, spec: str, limit: int = CRASH_LIMIT, last_step: str = "", now: float | None = None
) -> Verdict:
    """Whether a model with this record and this spec may run its risky steps at ``now`` (a pure decision).

    ``record`` is as this process knows it (open steps of dead processes already counted, :func:`crashes_seen`);
    ``last_step`` names, for the message, the step the agent last died in.
    """
    if record is None or record.spec != spec or record.crashes < limit:
        return Verdict(False)
    remaining = record.crashed_at + probation_s(record.crashes, limit) - (time.time() if now is None else now)
    if remaining <= 0:
        return Verdict(False)  # probation: the steps run again; completing them clears the record
    return Verdict(
        True,
        f"the agent died {record.crashes} times while processing this model (last step: {last_step or 'unknown'}); "
        f"it is tried again in {remaining:.0f} s, and each further death doubles the wait (edit the model, or delete "
        "it and create it again, to try at once)",
        remaining,
    )


def begun(record: Attempt | None, key: str, spec: str, step: Step, now: float) -> Attempt:
    """The record to write when ``step`` begins: the crashes of the same spec carried, another spec's dropped."""
    same = record is not None and record.spec == spec
    crashes, crashed_at = (record.crashes, record.crashed_at) if same and record is not None else (0, 0.0)
    return Attempt(key, spec, crashes, step.value, now, crashed_at)


class CrashRecords:
    """The attempt records of one node: read once from ``directory``, then kept by this process (the only writer).

    Thread-safe: the reconciler calls it from worker threads (each write fsyncs).
    """

    def __init__(self, directory: Path, *, limit: int = CRASH_LIMIT) -> None:
        self.directory = directory
        self.limit = limit
        self._records: dict[str, Attempt] | None = None
        self._last_step: dict[str, str] = {}
        self._lock = threading.Lock()

    def _file(self, key: str) -> Path:
        return self.directory / f"{token_for(key)}.json"

    def _loaded(self) -> dict[str, Attempt]:
        if self._records is None:
            records: dict[str, Attempt] = {}
            now = time.time()
            if self.directory.is_dir():  # a kill between a write and its rename left these (this node's only)
                for leftover in self.directory.glob(".*.tmp"):
                    with contextlib.suppress(OSError):
                        leftover.unlink()
            for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
                try:
                    raw = json_text.loads(path.read_text())
                    record = Attempt(
                        str(raw["key"]),
                        str(raw["spec"]),
                        int(raw.get("crashes", 0)),
                        str(raw.get("open_step", "")),
                        float(raw.get("started_at", 0.0)),
                        float(raw.get("crashed_at", 0.0)),
                    )
                # OverflowError: int(1e999) or float(10**400).
                except (OSError, ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
                    log.warning("unreadable attempt record ignored", file=str(path), error=str(exc))
                    continue
                if record.open_step:
                    log.warning(
                        "the agent died during a step of this model",
                        key=record.key,
                        step=record.open_step,
                        crashes=record.crashes + 1,
                        limit=self.limit,
                    )
                    self._last_step[record.key] = record.open_step
                records[record.key] = seen = crashes_seen(record, now)
                if seen is not record:  # counted now: written back, so the probation starts at this crash
                    with contextlib.suppress(OSError):
                        self._write(seen)
            self._records = records
        return self._records

    def get(self, key: str) -> Attempt | None:
        with self._lock:
            return self._loaded().get(key)

    def verdict(self, key: str, uid: str, generation: int) -> Verdict:
        with self._lock:
            record = self._loaded().get(key)
            return judge(record, spec_of(uid, generation), self.limit, self._last_step.get(key, ""), time.time())

    def begin(self, key: str, uid: str, generation: int, step: Step) -> None:
        with self._lock:
            records = self._loaded()
            record = begun(records.get(key), key, spec_of(uid, generation), step, time.time())
            self._write(record)
            records[key] = record

    def end(self, key: str) -> None:
        """The open step of ``key`` ended in a way this process survived: close it (its crashes stay)."""
        with self._lock:
            records = self._loaded()
            record = records.get(key)
            if record is None or not record.open_step:
                return
            closed = Attempt(record.key, record.spec, record.crashes, crashed_at=record.crashed_at)
            if closed.crashes:
                self._write(closed)
                records[key] = closed
            else:
                self._drop(key)

    def finished(self, key: str) -> None:
        """The model's processing completed (its manifest is saved): nothing is left to count."""
        with self._lock:
            if key in self._loaded():
                self._drop(key)

    forget = finished  # nothing of the model is left on this node: its record goes too

    def _write(self, record: Attempt) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(self._file(record.key), json.dumps(asdict(record), sort_keys=True).encode())

    def _drop(self, key: str) -> None:
        assert self._records is not None
        self._records.pop(key, None)
        self._last_step.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            self._file(key).unlink()
            fsync_dir(self.directory)
