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
