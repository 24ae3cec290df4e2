"""Go duration strings, as OME's flags take them (``--same-path-wait-timeout 30m``)."""

from __future__ import annotations

import pytest

from model_agent.model.go_duration import parse_go_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("500ms", 0.5),
        ("2h45m30.5s", 9930.5),
        ("0", 0.0),
        ("-5s", -5.0),
        ("+1m", 60.0),
        (".5h", 1800.0),
        ("10us", 1e-5),
        ("10µs", 1e-5),
    ],
)
def test_what_go_accepts(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "m", "1d", "1h 30m", "five minutes", "1.2.3s", "-"])
def test_what_go_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)
