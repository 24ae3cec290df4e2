"""Logging: structlog, one JSON object per line on stdout, with secrets redacted.

``configure(level)`` is called once by ``model-agent run``. A redaction step replaces any value under a
sensitive key (token, secret, password, authorization) and any registered secret string wherever it
appears, so a token can never reach a log line through an error message either. The standard library's
records (what httpx or huggingface_hub log themselves) pass the same masking through a handler filter.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SENSITIVE_KEYS = ("token", "secret", "password", "authorization", "credential")
_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a secret string so that it is masked wherever it appears in a log event."""
    if value and len(value) >= 4:
        _registered.add(value)


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        for secret in _registered:
            if secret in value:
                value = value.replace(secret, "[REDACTED]")
        return value
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mask(v) for v in value)
    return value


def redact(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if any(s in key.lower() for s in _SENSITIVE_KEYS):
            event[key] = "[REDACTED]"
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
