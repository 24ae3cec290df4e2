"""Loopback ports for the test bed's servers, proxies and agents."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port that was free a moment ago.

    Another process may take it before the caller binds it; callers that start a server on it retry (or fail
    with the server's own "address in use" message), which is why this is not a reservation.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
