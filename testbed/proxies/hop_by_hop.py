"""The headers both test-bed proxies drop when they forward a request or a response.

Role: one list for the counting proxy and the fault proxy, so the two forward alike. A header here
describes one hop of the connection (RFC 9110 section 7.6.1, plus the legacy ``Proxy-Connection``), or is
one aiohttp sets itself from the body it sends (``Content-Length``); forwarding it would describe the
wrong connection or the wrong body. Names are lower case: compare with ``name.lower()``.
"""

from __future__ import annotations

HOP_BY_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
