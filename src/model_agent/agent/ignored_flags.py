"""OME's flags this agent accepts for compatibility and does not use, and the warning when one is set.

Role: a DaemonSet written for OME's agent passes its flags unchanged, so ``model-agent run`` must accept every
one of them; a few have no meaning here because the transfer engine does the same job differently
(docs/ome-compatibility.md#46-concurrency-and-retries). Silently ignoring a value an operator chose hides
that it has no effect, so each such flag that is set (on the command line or as ``MODEL_AGENT_<NAME>``) is
logged once at start-up as a warning saying what governs that behaviour instead; ``--help`` and the README's
flags table (``agent/flags.py``) say so too.

Decisions as data: :func:`ignored_flags` is a pure function from the settings to the list of flags to warn
about; :func:`warn_ignored` logs them. A flag that is later wired into the engine is removed from
:data:`IGNORED`, and its warning with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from model_agent.agent.settings import Settings, flag_name

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class IgnoredFlag:
    """One accepted-but-ignored flag as set: its name, the value given, and what governs it instead."""

    flag: str
    value: object
    instead: str


# Settings field (its flag's name comes from the field, agent/settings.py) -> what does that job in this agent.
IGNORED: dict[str, str] = {
    "download_retry": (
        "the transfer engine retries each part (8 attempts in a row without progress), and a failed model is "
        "retried with backoff (1 s doubling to 5 min)"
    ),
    "concurrency": (
        "the engine fetches up to 8 objects (object stores) or 4 files (Hugging Face) of one model at once; "
        "--multipart-concurrency bounds the ranged parts in flight"
    ),
    "same_path_wait_timeout": (
        "nothing waits for another model's download at the same path: a second owner of a directory is refused "
        "(PathConflict) and the same owner's re-created model reuses the copy at once"
    ),
}


def ignored_flags(settings: Settings) -> list[IgnoredFlag]:
    """The ignored flags the operator set (explicitly: a default is not a choice), in :data:`IGNORED` order."""
    return [
        IgnoredFlag(flag_name(field), getattr(settings, field), instead)
        for field, instead in IGNORED.items()
        if field in settings.model_fields_set
    ]


def warn_ignored(settings: Settings) -> list[IgnoredFlag]:
    """Log one warning per ignored flag that is set; returns them (for the caller's tests)."""
    found = ignored_flags(settings)
    for item in found:
        log.warning(
            "flag accepted for OME compatibility and ignored",
            flag=item.flag,
            value=item.value,
            instead=item.instead,
        )
    return found
