"""The agent's own HTTP doors (:mod:`model_agent.ops.http`): the operator's tools answer on loopback only, and one
verification pass runs at a time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from model_agent.ops.http import HealthServer, HealthSources
from tests.support.waiting import until

DEADLINE_S = 10.0


class Passes:
    """A verification the test releases; ``running`` is what the agent would say of it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running: dict[str, Any] | None = None
        self.calls = 0

    async def verify(self, keys: list[str] | None) -> dict[str, list[str]]:
        self.calls += 1
        self.running = {"models": 3, "done": 1, "startedAt": 0.0, "scheduled": False}
        await self.release.wait()
        self.running = None
        return {}


def _server(passes: Passes) -> HealthServer:
    sources: Any = HealthSources(
        client=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        reflectors=[],
        roots=[],
        loop_tick=lambda: 0.0,
        synced=lambda: True,
        status=lambda: {"models": ["every tenant's"]},
        verify=passes.verify,
        verify_running=lambda: passes.running,
    )
    return HealthServer(sources, "127.0.0.1", 0)


def _request(method: str, path: str, remote: str) -> web.Request:
    return make_mocked_request(method, path).clone(remote=remote)


@pytest.mark.parametrize(
    ("remote", "status"),
    [("127.0.0.1", 200), ("::1", 200), ("::ffff:127.0.0.1", 200), ("10.0.0.5", 403), ("fd00::5", 403), ("", 403)],
)
async def test_status_answers_only_the_loopback_address(remote: str, status: int) -> None:
    server = _server(Passes())
    answer = await server._status(_request("GET", "/status", remote))
    assert answer.status == status
    if status == 403:
        assert "kubectl exec" in (answer.text or "")


async def test_verify_is_refused_off_loopback_and_one_pass_runs_at_a_time() -> None:
    passes = Passes()
    server = _server(passes)
    flood = await asyncio.gather(*(server._verify(_request("POST", "/verify", "10.0.0.5")) for _ in range(20)))
    assert {a.status for a in flood} == {403} and passes.calls == 0  # no pass started from off the node
    first = asyncio.create_task(server._verify(_request("POST", "/verify", "127.0.0.1")))
    await until(lambda: passes.running is not None, "the first pass running")
    second = await server._verify(_request("POST", "/verify", "127.0.0.1"))
    assert second.status == 409
    assert json.loads(second.body)["running"]["models"] == 3  # type: ignore[arg-type]
    passes.release.set()
    assert (await asyncio.wait_for(first, DEADLINE_S)).status == 200
    assert passes.calls == 1
