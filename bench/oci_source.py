"""What the ``oci://`` source costs beyond moving bytes: SDK import, RSA signing, control-plane requests.

Reproduce: ``.venv/bin/python -m bench.oci_source [--size-mib 256] [--files 4]``.
It starts FakeOciObjectStorage (tests/support/fake_oci.py; the real OCI service cannot run here) with a
throwaway user-principal key, fetches ``--files`` objects of ``--size-mib`` MiB each with :class:`OciSource`
into a temporary directory, and prints one JSON line: SDK import time (in a fresh interpreter), time per RSA
signature, wall time and MB/s of the fetch, HTTP requests by operation, and distinct signatures made for the
object GETs (signatures are reused per URL for up to a minute, so this is about one per object, not one per
part). Throughput here is bounded by the fake, a single-process Python ``http.server``: it is not a number for
the engine (see ``bench/ranged.py`` for that).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from model_agent.sources.base import FetchRequest
from model_agent.sources.oci import OciSource
from tests.support.fake_oci import FakeOciObjectStorage, write_user_principal

MiB = 1024 * 1024


def import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import oci.object_storage; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


def sign_seconds(config_path: Path, rounds: int = 200) -> float:
    import oci
    from oci._vendor import requests

    signer = oci.signer.Signer.from_config(oci.config.from_file(str(config_path)))
    start = time.perf_counter()
    for i in range(rounds):
        signer(requests.Request("GET", f"http://127.0.0.1:1/n/ns/b/b/o/x{i}").prepare())
    return (time.perf_counter() - start) / rounds


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        identity = write_user_principal(tmp / "identity")
        os.environ["OCI_CONFIG_PATH"] = str(identity.config_path)
        with FakeOciObjectStorage("benchns", {identity.key_id: identity.public_key}) as fake:
            blob = os.urandom(args.size_mib * MiB)
            for i in range(args.files):
                fake.put("bench", f"model/shard-{i}.bin", blob)
            request = FetchRequest(
                storage_uri="oci://n/benchns/b/bench/o/model",
                dest=tmp / "models" / "m",
                staging=tmp / "staging" / "m",
                previous=None,
                parameters={"auth": "UserPrincipal", "endpoint": fake.endpoint},
            )
            started = time.perf_counter()
            await OciSource().fetch(request)
            wall = time.perf_counter() - started
            gets = fake.operations("GetObject")
            total = args.files * args.size_mib * MiB
            print(
                json.dumps(
                    {
                        "files": args.files,
                        "size_mib": args.size_mib,
                        "sdk_import_s": round(import_seconds(), 2),
                        "rsa_sign_ms": round(sign_seconds(identity.config_path) * 1000, 3),
                        "fetch_s": round(wall, 2),
                        "mb_per_s": round(total / wall / 1e6, 1),
                        "requests": dict(Counter(r.operation for r in fake.requests)),
                        "distinct_get_signatures": len({r.headers.get("authorization") for r in gets}),
                    }
                )
            )


if __name__ == "__main__":
    asyncio.run(main())
