"""Logging: structlog, one JSON object per line on stdout, with secrets redacted.

``configure(level)`` is called once by ``model-agent run``. A redaction step replaces any value under a
sensitive key (token, secret, password, authorization) and any registered secret string wherever it
appears, so a token can never reach a log line through an error message either. The standard library's
records (what httpx or huggingface_hub log themselves) pass the same masking through a handler filter.

The registry is bounded because tenants feed it: a Secret's values come from a namespaced object's
author. Only values of at least :data:`MIN_SECRET_LENGTH` characters are kept (a value like ``model``
or ``Failed`` would otherwise mask ordinary words in every later line). The platform's values (``HF_TOKEN``, a
ClusterBaseModel's Secret: ``namespace=None``) are pinned: no tenant's registration ever evicts them, only the
platform's own beyond :data:`MAX_PLATFORM_SECRETS`. A tenant's values live in its namespace's share, at most
:data:`MAX_PER_NAMESPACE` (its oldest goes first), and all tenants together keep at most :data:`MAX_SECRETS`
(the oldest of the namespace holding the most goes first): a tenant flooding the registry evicts its own values,
never the platform's and hardly another tenant's. Every string is matched against all of them in one pass of one
compiled pattern, so masking costs the same with 10 secrets or 1,000.
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
MAX_SECRETS: Final = 1024  # tenants' values, all namespaces together
MAX_PER_NAMESPACE: Final = 128  # one namespace's share
MAX_PLATFORM_SECRETS: Final = 1024  # the platform's own (pinned against tenants)
_REDACTED: Final = "[REDACTED]"
# Insertion-ordered: the oldest registration is the first to go when a share is full.
_platform: dict[str, None] = {}
_tenants: dict[str, dict[str, None]] = {}
_pattern: re.Pattern[str] | None = None


def register_secret(value: str | None, namespace: str | None = None) -> None:
    """Remember a credential so that it is masked wherever it appears in a log event.

    ``namespace``: the tenant whose Secret (or spec) gave it; None for the platform's own (pinned). Register only
    strings that are used as credentials; shorter than :data:`MIN_SECRET_LENGTH` they are ignored (too likely to
    be an ordinary word, and too short to be a real key).
    """
    global _pattern
    if not value or len(value) < MIN_SECRET_LENGTH:
        return
    if namespace is None:
        _tenants_drop(value)  # a value the platform uses is the platform's, whoever registered it first
        _platform[value] = _platform.pop(value, None)  # newest
        while len(_platform) > MAX_PLATFORM_SECRETS:
            del _platform[next(iter(_platform))]
        _pattern = None
        return
    if value in _platform:
        return
    share = _tenants.setdefault(namespace, {})
    known = value in share
    share[value] = share.pop(value, None)  # refreshed: now the newest of its namespace
    if known:
        return
    while len(share) > MAX_PER_NAMESPACE:
        del share[next(iter(share))]
    while sum(len(v) for v in _tenants.values()) > MAX_SECRETS:
        fullest = max(_tenants.values(), key=len)
        del fullest[next(iter(fullest))]
    _pattern = None


def _tenants_drop(value: str) -> None:
    for share in _tenants.values():
        share.pop(value, None)


def is_credential_name(name: str) -> bool:
    """Whether a Secret data key (or a log field) names a credential, e.g. ``AWS_SECRET_ACCESS_KEY``, ``sasToken``."""
    lowered = name.lower()
    return any(s in lowered for s in _CREDENTIAL_NAME_PARTS)


def forget_secret(value: str) -> None:
    """Stop masking ``value`` (tests; a rotated credential simply ages out)."""
    global _pattern
    _platform.pop(value, None)
    _tenants_drop(value)
    _pattern = None


def registered_count() -> int:
    """How many secret strings are masked now (bounded); for tests and ``/status``."""
    return len(_platform) + sum(len(v) for v in _tenants.values())


def _secrets_pattern() -> re.Pattern[str] | None:
    global _pattern
    if _pattern is None and registered_count():
        # Longest first, so a secret that contains another is masked whole.
        every = {*_platform, *(v for share in _tenants.values() for v in share)}
        alternatives = sorted(every, key=len, reverse=True)
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
    if not registered_count():
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
