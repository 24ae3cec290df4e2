"""Go's duration strings (``time.ParseDuration``), as OME's flags take them: ``30m``, ``1h30m``, ``1.5s``, ``500ms``.

Role: a flag OME's agent declares as a ``time.Duration`` arrives here as the text its chart passes; this module
turns it into seconds with Go's grammar (a sequence of decimal numbers, each with a unit among ``ns``, ``us``,
``µs``, ``ms``, ``s``, ``m``, ``h``; an optional sign; ``0`` alone without a unit), so a value Go accepts is
accepted and one Go refuses is refused with the same reason at start-up.
"""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds of a Go duration string; ValueError (naming the text) when Go would refuse it."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    seconds, at = 0.0, 0
    while at < len(body):
        part = _PART.match(body, at)
        if part is None:
            raise ValueError(f"invalid duration {text!r}: a number with a unit (ns, us, ms, s, m, h) was expected")
        seconds += float(part.group(1)) * _UNITS[part.group(2)]
        at = part.end()
    return sign * seconds
