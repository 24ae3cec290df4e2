"""The byte-level fault proxy of the download benchmark against a small threaded HTTP origin on loopback.

The origin serves one file, whole or by ``Range``; each test arms one fault and reads what the client got
and what the proxy counted.
"""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from testbed.proxies.streamfaultproxy import Faults, HttpFaultProxy

BODY = os.urandom(3 * 256 * 1024 + 17)  # more than one pump chunk, not a multiple of it
PATH = "/bucket/model.safetensors"


class _Origin(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hits: list[str] = []  # noqa: RUF012 - one origin per test module, reset by the fixture

    def do_GET(self) -> None:
        self.hits.append(self.path)
        start, end = 0, len(BODY) - 1
        ranged = self.headers.get("Range")
        if ranged:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            start, end = int(first), int(last)
        self.send_response(206 if ranged else 200)
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(BODY)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.wfile.write(BODY[start : end + 1])

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[HttpFaultProxy]:
    _Origin.hits = []
    origin = ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    thread = threading.Thread(target=origin.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        with HttpFaultProxy(origin.server_address[1]) as fault_proxy:
            yield fault_proxy
    finally:
        origin.shutdown()
        origin.server_close()
        thread.join(10)


def _get(proxy: HttpFaultProxy, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", PATH, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        conn.close()


def test_forwards_unchanged_and_counts_body_bytes_per_path(proxy: HttpFaultProxy) -> None:
    assert _get(proxy)[:2] == (200, BODY)
    assert _get(proxy, {"Range": "bytes=10-99"})[:2] == (206, BODY[10:100])
    assert proxy.counters.body_bytes == len(BODY) + 90
    assert proxy.counters.by_suffix("model.safetensors") == len(BODY) + 90
    assert [(r.method, r.path, r.status) for r in proxy.counters.requests] == [("GET", PATH, 200), ("GET", PATH, 206)]


def test_flips_the_byte_at_a_file_offset_in_whole_and_ranged_answers(proxy: HttpFaultProxy) -> None:
    offset = 256 * 1024 + 5  # in the second pump chunk of the whole answer
    proxy.reset(Faults(flip_suffix="model.safetensors", flip_offset=offset))
    whole = _get(proxy)[1]
    ranged = _get(proxy, {"Range": f"bytes={offset - 3}-{offset + 3}"})[1]
    assert [i for i, (a, b) in enumerate(zip(whole, BODY, strict=True)) if a != b] == [offset]
    assert whole[offset] == BODY[offset] ^ 0xFF
    expected = bytearray(BODY[offset - 3 : offset + 4])
    expected[3] ^= 0xFF
    assert ranged == expected
    assert proxy.counters.flipped == 2


def test_cuts_the_connection_once_after_the_armed_bytes(proxy: HttpFaultProxy) -> None:
    proxy.reset(Faults(cut_after=300 * 1024))
    with pytest.raises(http.client.HTTPException):
        _get(proxy)
    assert proxy.counters.cuts == 1
    assert _get(proxy)[:2] == (200, BODY)  # fired once
    assert proxy.counters.cuts == 1


def test_answers_429_with_retry_after_without_forwarding(proxy: HttpFaultProxy) -> None:
    proxy.reset(Faults(reply_429=1, reply_429_suffix=".safetensors", retry_after_s=7))
    status, body, headers = _get(proxy)
    assert (status, body, headers["Retry-After"]) == (429, b"", "7")
    assert _Origin.hits == []
    assert _get(proxy)[:2] == (200, BODY)
    assert _Origin.hits == [PATH]
    assert len(proxy.counters.replied_429) == 1


def test_stop_ends_open_connections_and_is_idempotent(proxy: HttpFaultProxy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    conn.request("GET", PATH)
    conn.getresponse().read()  # a kept-alive connection the proxy holds open
    proxy.stop()
    proxy.stop()
    assert proxy.port == 0
    conn.request("GET", PATH)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        conn.getresponse()
    conn.close()
