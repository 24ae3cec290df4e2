"""Where one fetch's bytes come from, counted as they arrive: the origin, peers, or a shared root.

Role: a source that knows where it takes its bytes (``hf://`` with peers, :mod:`model_agent.sources.hf`) reports
its progress as :class:`SourcedProgress`, a :class:`~model_agent.sources.base.Progress` with running counts; so
does a node adopting another node's publication on a shared root (:mod:`model_agent.agent.shared_root`). The
reconciler writes the counts into the node's ConfigMap entry (``bytesBySource``, :mod:`model_agent.model.entry`),
and the fetcher keeps the counts of a finished fetch for the entry of the Ready copy.

Contract: :func:`by_source` gives the counts of a progress, or None for a plain ``Progress`` (a source that does
not count): unknown is shown as nothing, never as a guess. Bytes an attempt resumed from an earlier one count
nowhere, since where they came from is not known.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_agent.model.entry import BytesBySource
from model_agent.sources.base import Progress


@dataclass
class SourcedProgress(Progress):
    """A fetch's progress with the bytes it took from each place so far."""

    origin_bytes: int = 0
    peer_bytes: int = 0
    shared_root_bytes: int = 0


def by_source(progress: Progress | None) -> BytesBySource | None:
    """The counts of ``progress`` in the entry's form; None when it does not count them."""
    if not isinstance(progress, SourcedProgress):
        return None
    return BytesBySource(
        origin=max(0, progress.origin_bytes),
        peer=max(0, progress.peer_bytes),
        shared_root=max(0, progress.shared_root_bytes),
    )
