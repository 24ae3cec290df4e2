"""The one error type a fetch fails with, shared by every layer that can fail one.

Role: :class:`SourceError` carries a machine ``reason`` (a :class:`~model_agent.model.reasons.Reason`, or its
string) and a human ``message``; both end up in the model's ``Failed`` entry, its Warning Event and the log.
It lives in ``model/`` (the bottom layer) because the disk check in ``local/``, the transfer engine and every
source raise it, and none of them may import the others' packages. ``model_agent.sources.base`` re-exports it
under its old name for the code that imports it from there.

Contract: ``retryable`` says whether the same fetch may succeed later without a spec change (a timeout, a full
disk, a rate limit) or not (a refused path, a missing repository: retried only after the spec changes).

:class:`ReasonError` is the base of the errors a value the agent cannot use raises before any fetch (a model
object, a storage URI): its ``reason`` is the complete sentence that becomes the model's ``Failed`` reason.
"""

from __future__ import annotations


class SourceError(Exception):
    """A fetch failed for ``reason``; ``message`` says what happened and, where it can, what to do instead."""

    def __init__(self, reason: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        # A plain str even when given a Reason member: logs, JSON and reprs then show the wire word only.
        self.reason = str(reason)
        self.message = message
        self.retryable = retryable


class ReasonError(ValueError):
    """A value that cannot be used; ``reason`` is a complete human-readable sentence (also the message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
