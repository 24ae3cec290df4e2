"""IP addresses as the agent compares them (:mod:`model_agent.transfer.addresses`)."""

from __future__ import annotations

import ipaddress

import pytest

from model_agent.transfer.addresses import parse_ip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.2", "10.0.0.2"),
        ("::ffff:10.0.0.2", "10.0.0.2"),  # a dual-stack socket's view of an IPv4 peer
        ("[::1]", "::1"),
        ("fd00::5", "fd00::5"),
        ("host.example", None),
        ("", None),
    ],
)
def test_parse_ip(text: str, expected: str | None) -> None:
    assert parse_ip(text) == (ipaddress.ip_address(expected) if expected else None)
