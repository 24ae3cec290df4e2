"""IP addresses as the agent compares them: ``[v6]`` brackets dropped, and an IPv4-mapped IPv6 address
(``::ffff:10.0.0.2``, what a dual-stack socket reports for an IPv4 peer) read as the IPv4 address it is."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def unmapped(address: IPAddress) -> IPAddress:
    """``address``, or the IPv4 address an IPv4-mapped IPv6 address stands for."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_ip(text: str) -> IPAddress | None:
    """The address written in ``text`` (brackets allowed), unmapped; None when it is no IP address."""
    try:
        return unmapped(ipaddress.ip_address(text.strip().strip("[]")))
    except ValueError:
        return None
