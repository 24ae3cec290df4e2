"""An attack client for the doors tests: requests with random bearer tokens, from several loopback addresses at once.

Run as its own process (``python -m testbed.token_flood PORT SECONDS SOURCE...``), usually at the lowest CPU priority:
on the test bed the attacker shares the machine's two cores with the agent, which a real attacker on another machine
does not, so its own CPU must not be what slows the agent down. Each source address keeps ``--concurrency`` requests
in flight to ``http://127.0.0.1:PORT/blobs/sha256/0…0`` with a fresh random token each, for SECONDS; it prints the
number of requests answered or refused as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time

import aiohttp


async def flood(port: int, seconds: float, sources: list[str], concurrency: int) -> int:
    deadline = time.monotonic() + seconds
    sent = [0]

    async def from_source(source: str) -> None:
        connector = aiohttp.TCPConnector(local_addr=(source, 0), limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one() -> None:
                while time.monotonic() < deadline:
                    headers = {"Authorization": f"Bearer {secrets.token_urlsafe(600)}"}
                    try:
                        async with session.get(f"http://127.0.0.1:{port}/blobs/sha256/{'0' * 64}", headers=headers):
                            sent[0] += 1
                    except aiohttp.ClientError:
                        sent[0] += 1

            await asyncio.gather(*(one() for _ in range(concurrency)))

    await asyncio.gather(*(from_source(s) for s in sources))
    return sent[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("sources", nargs="+")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    sent = asyncio.run(flood(args.port, args.seconds, args.sources, args.concurrency))
    print(json.dumps({"requests": sent}), flush=True)


if __name__ == "__main__":
    main()
