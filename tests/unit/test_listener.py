"""The agent's listeners are bounded (:mod:`model_agent.ops.listener`): connections past a cap are closed at once,
a slow request head is closed at its deadline, an oversized head is refused, and the listener still serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from model_agent.ops.listener import Gate, Limits, serve
from tests.support.waiting import until

DEADLINE_S = 10.0
PARTIAL_HEAD = b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000 + b"\r\n"  # no final CRLF: never complete


async def ok(_req: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
async def listener() -> AsyncIterator[tuple[int, Gate, list[str]]]:
    app = web.Application()
    app.router.add_get("/ok", ok)
    refused: list[str] = []
    limits = Limits(max_connections=6, per_source=4, head_timeout_s=0.5, max_headers=16)
    runner, port, gate = await serve(app, "127.0.0.1", 0, limits, name="test", on_refused=refused.append)
    try:
        yield port, gate, refused
    finally:
        await runner.cleanup()


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (EOF or a reset) within the deadline."""
    try:
        data = await asyncio.wait_for(reader.read(65536), DEADLINE_S)
    except ConnectionError:
        return True
    return data == b"" or data.split(b"\r\n", 1)[0].split(b" ")[1].startswith(b"4")


async def _get(port: int, source: str = "127.0.0.1") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), DEADLINE_S)
    writer.close()
    return data


async def test_connections_past_the_per_source_cap_are_closed_at_once_and_others_still_served(
    listener: tuple[int, Gate, list[str]],
) -> None:
    port, gate, refused = listener
    held = []
    for _ in range(7):  # one address, half-sent heads: 4 admitted, 3 closed at accept
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PARTIAL_HEAD)
        held.append((reader, writer))
    await until(lambda: gate.refused >= 3, "the connections past the cap refused", timeout=DEADLINE_S)
    assert gate.open <= 4 and refused.count("per-source") == 3
    assert (await _get(port, "127.0.0.2")).startswith(b"HTTP/1.1 200")  # another address is still served
    for reader, writer in held:  # every half-sent head is closed: 3 at once, 4 at the head deadline
        assert await _closed(reader)
        writer.close()
    await until(lambda: gate.open == 0, "every place released", timeout=DEADLINE_S)
    assert "slow-head" in refused


async def test_the_total_cap_holds_across_addresses(listener: tuple[int, Gate, list[str]]) -> None:
    port, gate, refused = listener
    held = []
    for i in range(9):  # 9 addresses, 1 each: 6 admitted (the total), 3 closed
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(f"127.0.1.{i + 1}", 0))
        writer.write(PARTIAL_HEAD)
        held.append((reader, writer))
    await until(lambda: refused.count("total") == 3, "the connections past the total refused", timeout=DEADLINE_S)
    assert gate.open <= 6
    for _, writer in held:
        writer.close()
    await until(lambda: gate.open == 0, "every place released", timeout=DEADLINE_S)
    assert (await _get(port)).startswith(b"HTTP/1.1 200")


async def test_a_head_of_too_many_headers_is_refused_not_buffered(
    listener: tuple[int, Gate, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    port, _, refused = listener
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 8000) for i in range(127))
    writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    answer = await asyncio.wait_for(reader.read(65536), DEADLINE_S)
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    writer.close()
    await until(lambda: "bad-head" in refused, "the bad head counted", timeout=DEADLINE_S)
    assert not [r for r in caplog.records if r.name == "aiohttp.server"]  # no traceback per bad request


# ------------------------------------------------------------------------------------------ the refusal budget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_source_that_spends_its_refusal_budget_is_shut_out_for_the_penalty_and_others_are_not() -> None:
    clock = Clock()
    limits = Limits(max_connections=8, per_source=4, head_timeout_s=1, refusals_per_s=2, refusal_burst=5, penalty_s=30)
    gate = Gate("peer", limits, clock=clock)
    refusals: list[bool] = [gate.refused_request("10.0.0.9") for _ in range(6)]
    assert refusals == [False] * 5 + [True]  # the burst, then shut out
    assert gate.admit("10.0.0.9") == "penalty"
    assert gate.refused_request("10.0.0.9")  # a connection opened before: it ends with its answer
    assert gate.admit("10.0.0.8") == ""  # another address is not affected
    clock.now += 29.9
    assert gate.admit("10.0.0.9") == "penalty"
    clock.now += 0.2
    assert gate.admit("10.0.0.9") == ""  # the penalty is over


def test_the_budget_refills_at_its_rate() -> None:
    clock = Clock()
    limits = Limits(max_connections=8, per_source=4, head_timeout_s=1, refusals_per_s=2, refusal_burst=5, penalty_s=30)
    gate = Gate("peer", limits, clock=clock)
    for _ in range(200):  # two refusals a second, for 100 s: within the budget
        assert not gate.refused_request("10.0.0.9")
        clock.now += 0.5


def test_the_sources_remembered_are_bounded() -> None:
    clock = Clock()
    limits = Limits(max_connections=8, per_source=4, head_timeout_s=1, refusals_per_s=2, refusal_burst=1, penalty_s=30)
    gate = Gate("peer", limits, clock=clock)
    for i in range(10_000):
        gate.refused_request(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
        gate.refused_request(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(gate._budget) <= 4096 and len(gate._shut_out) <= 4096


def test_no_budget_means_no_shut_out() -> None:
    gate = Gate("health", Limits(max_connections=8, per_source=4, head_timeout_s=1))
    assert not any(gate.refused_request("10.0.0.9") for _ in range(1000))
    assert gate.admit("10.0.0.9") == ""


async def test_a_shut_out_sources_connections_are_held_unread_until_the_head_deadline() -> None:
    app = web.Application()
    app.router.add_get("/ok", ok)
    refused: list[str] = []
    limits = Limits(
        max_connections=6, per_source=2, head_timeout_s=0.5, refusals_per_s=1, refusal_burst=1, penalty_s=60
    )
    runner, port, gate = await serve(app, "127.0.0.1", 0, limits, name="test", on_refused=refused.append)
    try:
        gate.refused_request("127.0.0.9")
        assert gate.refused_request("127.0.0.9")  # shut out
        held = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.9", 0))
            writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append((reader, writer))
        await until(lambda: refused.count("penalty") >= 3, what="both connections held")
        assert gate.by_source.get("127.0.0.9") == 2  # within its own cap, and never answered
        third_reader, _ = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.9", 0))
        assert await _closed(third_reader)  # past its cap: closed at once
        for reader, _ in held:  # closed at the head deadline, unanswered
            assert await _closed(reader)
        assert b"200 OK" in await _get(port, "127.0.0.8")  # others are served throughout
        await until(lambda: "127.0.0.9" not in gate.by_source, what="their places given back")
    finally:
        await runner.cleanup()
