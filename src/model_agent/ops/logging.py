"""Logging: structlog, one JSON object per line on stdout, with secrets redacted.

``configure(level)`` is called once by ``model-agent run``. A redaction step replaces any value under a
sensitive key (token, secret, password, authorization) and any registered secret string wherever it
appears, so a token can never reach a log line through an error message either. The standard library's
records (what httpx or huggingface_hub log themselves) pass the same masking through a handler filter.

The registry is bounded because tenants feed it: a Secret's values come from a namespaced object's
author. Only values of at least :data:`MIN_SECRET_LENGTH` characters are kept (a value like ``model``
or ``Failed`` would otherwise mask ordinary words in every later line), at most :data:`MAX_SECRETS` of
them (the oldest registered is forgotten first), and every string is matched against all of them in one
pass of one compiled pattern, so masking costs the same with 10 secrets or 1,000.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, Final

import structlog

_SENSITIVE_KEYS = ("token", "secret", "password", "authorization", "credential")
# Secret data keys whose values are credentials (the sources' key names all contain one of these).
_CREDENTIAL_NAME_PARTS = (*_SENSITIVE_KEYS, "key", "sas", "passphrase", "private")
MIN_SECRET_LENGTH: Final = 12
MAX_SECRETS: Final = 1024
_REDACTED: Final = "[REDACTED]"
# Insertion-ordered: the oldest registration is the first to go when the registry is full.
_registered: dict[str, None] = {}
_pattern: re.Pattern[str] | None = None


def register_secret(value: str | None) -> None:
    """Remember a credential so that it is masked wherever it appears in a log event.

    Register only strings that are used as credentials; shorter than :data:`MIN_SECRET_LENGTH` they are
    ignored (too likely to be an ordinary word, and too short to be a real key).
    """
    global _pattern
    if not value or len(value) < MIN_SECRET_LENGTH:
        return
    if value in _registered:
        _registered[value] = _registered.pop(value)  # refreshed: now the newest
        return
    _registered[value] = None
    while len(_registered) > MAX_SECRETS:
        del _registered[next(iter(_registered))]
    _pattern = None


def is_credential_name(name: str) -> bool:
    """Whether a Secret data key (or a log field) names a credential, e.g. ``AWS_SECRET_ACCESS_KEY``, ``sasToken``."""
    lowered = name.lower()
    return any(s in lowered for s in _CREDENTIAL_NAME_PARTS)


def forget_secret(value: str) -> None:
    """Stop masking ``value`` (tests; a rotated credential simply ages out)."""
    global _pattern
    if _registered.pop(value, 0) is None:
        _pattern = None


def registered_count() -> int:
    """How many secret strings are masked now (bounded by ``MAX_SECRETS``); for tests and ``/status``."""
    return len(_registered)


def _secrets_pattern() -> re.Pattern[str] | None:
    global _pattern
    if _pattern is None and _registered:
        # Longest first, so a secret that contains another is masked whole.
        alternatives = sorted(_registered, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(s) for s in alternatives))
    return _pattern


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        pattern = _secrets_pattern()
        return pattern.sub(_REDACTED, value) if pattern is not None else value
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mask(v) for v in value)
    return value


def redact(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The structlog processor: mask credential-named fields whole and every registered secret wherever it appears."""
    for key in list(event):
        if any(s in key.lower() for s in _SENSITIVE_KEYS):
            event[key] = _REDACTED
        else:
            event[key] = _mask(event[key])
    return event


def redact_record(record: logging.LogRecord) -> bool:
    """A stdlib ``logging`` filter: the same masking for libraries' own log records (httpx, huggingface_hub)."""
    if not _registered:
        return True
    message = record.getMessage()
    masked = _mask(message)
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = _mask(record.exc_text)
    if record.stack_info:
        record.stack_info = _mask(record.stack_info)
    return True


def configure(level: str = "info") -> None:
    """Install JSON logging at ``level`` with redaction on structlog's and the standard library's records alike.

    Raises ValueError for an unknown level, so ``model-agent run`` fails at once instead of logging nothing.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (use debug, info, warning or error)")
    logging.basicConfig(level=numeric, stream=sys.stdout, format="%(message)s")
    for handler in logging.getLogger().handlers:
        if redact_record not in handler.filters:
            handler.addFilter(redact_record)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
