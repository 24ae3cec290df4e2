"""A registered secret never reaches a rendered log line: messages, exception text, nested values, keys."""

from __future__ import annotations

import base64
import io
import json
import logging
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from model_agent.ops import logging as agent_logging
from model_agent.ops.logging import redact, redact_record, register_secret


@pytest.fixture
def token() -> Iterator[str]:
    value = "hf_" + secrets.token_hex(16)
    register_secret(value)
    yield value
    agent_logging.forget_secret(value)


def render(method: str = "info", *args: Any, **kw: Any) -> str:
    """Render one event through the agent's processor chain (the part after the stdlib integration)."""
    logger = structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=[structlog.processors.format_exc_info, redact, structlog.processors.JSONRenderer()],
    )
    out: str = getattr(logger, method)(*args, **kw)
    return out


def test_token_in_the_message_is_redacted(token: str) -> None:
    line = render("info", f"GET https://hub/api?token={token} failed")
    assert token not in line and "[REDACTED]" in line


def test_token_in_a_field_and_a_nested_dict_is_redacted(token: str) -> None:
    line = render(
        "warning",
        "fetch failed",
        error=f"401 for Bearer {token}",
        details={"headers": {"x": [f"a{token}b", ("t", token)]}, "n": 3},
    )
    assert token not in line
    doc = json.loads(line)
    assert doc["details"]["n"] == 3
    assert doc["details"]["headers"]["x"][0] == "a[REDACTED]b"


def test_token_in_an_exception_text_is_redacted(token: str) -> None:
    try:
        raise RuntimeError(f"upstream said: invalid token {token!r}")
    except RuntimeError:
        line = render("exception", "fetch crashed")
    assert token not in line
    assert "RuntimeError" in line and "[REDACTED]" in line


def test_sensitive_keys_are_redacted_whatever_their_value(token: str) -> None:
    line = render("info", "resolved", token="anything", Authorization="Bearer x", hf_secret_name="n")
    doc = json.loads(line)
    assert doc["token"] == doc["Authorization"] == doc["hf_secret_name"] == "[REDACTED]"


def test_unregistered_text_and_short_values_pass_through() -> None:
    register_secret("abc")  # too short to register: it would mask ordinary words
    line = render("info", "abcdef is fine")
    assert "abcdef is fine" in line


def test_the_base64_form_registered_from_a_secret_is_redacted(token: str) -> None:
    encoded = base64.b64encode(token.encode() + b"\n").decode()  # as `kubectl create secret --from-file` stores it
    register_secret(encoded)
    try:
        line = render("info", "secret read", body={"data": {"token": encoded}})
    finally:
        agent_logging.forget_secret(encoded)
    assert token not in line and encoded not in line


def test_stdlib_records_of_libraries_are_redacted(token: str) -> None:
    """httpx, huggingface_hub and friends log through ``logging``, not structlog: the handler filter masks them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(redact_record)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger = logging.getLogger("tests.some_library")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        logger.debug("Send: curl -H 'authorization: Bearer %s' %s", token, "https://hub")
        logger.info({"nested": {"token": token}})
        try:
            raise ValueError(f"bad credentials {token}")
        except ValueError:
            logger.exception("request failed")
        logger.warning("nothing secret here: %d files", 3)
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert token not in text
    assert text.count("[REDACTED]") == 3
    assert "ValueError" in text and "nothing secret here: 3 files" in text


def test_ordinary_words_from_a_tenant_secret_do_not_mask_log_lines() -> None:
    """A tenant's Secret may hold values like "model" or "Failed": they must not mask later lines."""
    for word in ("model", "Failed", "BaseModel/", "team-a/x ab"):
        register_secret(word)
    line = render("warning", "model failed", reason="Failed: BaseModel/team-a/x abcdefg")
    doc = json.loads(line)
    assert doc["event"] == "model failed"
    assert doc["reason"] == "Failed: BaseModel/team-a/x abcdefg"


def test_a_namespaces_share_is_bounded_and_forgets_its_oldest_first() -> None:
    values = [f"credential-{i:06d}-{secrets.token_hex(4)}" for i in range(agent_logging.MAX_PER_NAMESPACE + 50)]
    before = agent_logging.registered_count()  # (what earlier tests left)
    try:
        for value in values:
            register_secret(value, "team-a")
        assert agent_logging.registered_count() <= before + agent_logging.MAX_PER_NAMESPACE
        line = render("info", f"old {values[0]} new {values[-1]}")
        assert values[-1] not in line  # the newest is masked
        assert values[0] in line  # the oldest aged out
    finally:
        for value in values:
            agent_logging.forget_secret(value)


def test_a_tenant_flooding_the_registry_never_evicts_the_platforms_token_nor_much_of_another_tenants() -> None:
    """One tenant Secret of 1,100 credential-named keys (and many such Secrets): the platform's HF_TOKEN, registered
    first, is still masked; another tenant's one token too."""
    platform = "hf_" + secrets.token_hex(16)
    other = "other-" + secrets.token_hex(12)
    flood = [f"flood-{i:06d}-{secrets.token_hex(6)}" for i in range(agent_logging.MAX_SECRETS + 1100)]
    before = agent_logging.registered_count()  # (what earlier tests left)
    try:
        register_secret(platform)
        register_secret(other, "team-b")
        for i, value in enumerate(flood):
            register_secret(value, f"team-evil-{i % 20}")  # a tenant with many namespaces, each filled
        assert agent_logging.registered_count() <= before + agent_logging.MAX_SECRETS + 1
        line = render("info", f"token {platform} and {other}")
        assert platform not in line and other not in line
        register_secret(platform, "team-evil-0")  # a tenant naming the platform's value cannot take it over
        for value in flood[:300]:
            register_secret(value, "team-evil-0")
        assert platform not in render("info", f"token {platform}")
    finally:
        for value in (platform, other, *flood):
            agent_logging.forget_secret(value)


def test_a_secret_containing_another_is_masked_whole() -> None:
    short = "k-" + secrets.token_hex(6)
    long = short + "-" + secrets.token_hex(8)
    register_secret(short)
    register_secret(long)
    try:
        line = render("info", f"key {long} and {short}")
    finally:
        agent_logging.forget_secret(short)
        agent_logging.forget_secret(long)
    assert short not in line and line.count("[REDACTED]") == 2
