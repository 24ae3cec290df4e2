"""A real S3 API (moto's server mode) on loopback, for the S3 source's tests and the demo.

Role: the S3 origin the end-to-end tests fetch from. Nothing is faked in the client: boto3 and the ranged
engine talk HTTP to ``moto_server`` (``moto[server]``, pinned to :data:`MOTO_VERSION` in the dev extras of
the main virtual environment; its pins do not conflict with ours), which implements listing with
pagination, single-part ETags (the MD5) and multipart ETags (``"<md5 of part md5s>-<N>"``), ranges,
``If-Match``, and S3's error codes.

Contract:

* :class:`MotoServer` starts ``python -m moto.server`` on a free ``127.0.0.1`` port, with its output in
  ``<state_dir>/moto.log``; ``start`` returns once it answers HTTP (deadline ``start_timeout``) and retries
  another port if the one picked was taken meanwhile; ``stop`` sends SIGTERM, then SIGKILL after
  ``stop_timeout``. ``start``/``stop`` block; ``astart``/``astop`` and ``async with`` run them in a thread.
* :meth:`MotoServer.requests` parses the server's access log into ``(method, path, status)`` records since a
  :meth:`MotoServer.mark`; a request is logged when its response starts, so once a client call returns its
  request is there (read the log after the call). Requests of a client that gave up are still served and
  logged later: :meth:`MotoServer.wait_quiet` first. Paths include the query string as sent.
* :meth:`MotoServer.client` is a boto3 S3 client with moto's dummy credentials; :func:`create_bucket` and
  :func:`upload_objects` fill a bucket (``multipart_threshold`` forces multipart uploads, so ETags get
  ``-N``). State lives in the server process only: it is gone when the server stops (or after :meth:`reset`).
* moto is for S3 *semantics*. It is CPU-bound Python (about 0.3 GB/s for one stream here): measure
  throughput against nginx (``bench/ranged.py``), never against this.

Errors meant for a person are :class:`MotoError`, with one line saying what to do.
"""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.servers.service import LocalProcess

if TYPE_CHECKING:
    from types_boto3_s3.client import S3Client
    from types_boto3_s3.type_defs import CompletedPartTypeDef

MOTO_VERSION = "5.2.5"
DUMMY_KEY_ID = DUMMY_SECRET = "testing"  # the credentials moto accepts: any
DEFAULT_REGION = "us-east-1"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ACCESS = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3}) ')


class MotoError(Exception):
    """A failure a person can act on; the message is one line that says what to do."""


@dataclass(frozen=True)
class MotoRequest:
    """One request as moto's access log recorded it: what the server really served."""

    method: str
    path: str
    status: int


class MotoServer(LocalProcess):
    """moto's S3 server on loopback; use ``with MotoServer(dir) as s3:`` and :attr:`endpoint`.

    The process handling (free port, log file, start-up wait and retry, stop) is
    :class:`~testbed.servers.service.LocalProcess`'s; this class adds moto's command line and its access log.
    """

    name = "moto"
    error = MotoError
    ready_path = "/moto-api/"  # moto's own API

    def argv(self, port: int) -> list[str]:
        """moto's server mode from this interpreter (where the dev extras installed it), on loopback."""
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    def env(self) -> dict[str, str]:
        """Unbuffered, so a request is in the access log as soon as its response starts; nothing else inherited."""
        return {"PYTHONUNBUFFERED": "1", "PATH": "/usr/bin:/bin"}

    def prepare(self) -> None:
        """Refuse, with the install command, when moto is missing (rather than a start-up crash)."""
        try:
            import moto  # noqa: F401
        except ImportError as exc:
            raise MotoError(f"moto is not installed: pip install 'moto[server]=={MOTO_VERSION}'") from exc

    def reset(self) -> None:
        """Forget every bucket and object (moto's own reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    # -- request log
    def mark(self) -> int:
        """A position in the access log; pass it to :meth:`requests` to see only what came after."""
        return self.log_size()

    def wait_quiet(self, quiet: float = 0.3, timeout: float = 10.0) -> None:
        """Wait until the access log has not grown for ``quiet`` seconds (at most ``timeout``).

        A client that gave up (cancelled) leaves requests that moto still serves and logs afterwards; call
        this before :meth:`mark` so they are not counted as the next client's.
        """
        deadline = time.monotonic() + timeout
        size, since = self.mark(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.mark()
            if now != size:
                size, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return

    def requests(self, since: int = 0) -> list[MotoRequest]:
        """The requests served since log offset ``since`` (0: since start), parsed from the access log."""
        records = []
        for line in _ANSI.sub("", self.log_since(since)).splitlines():
            m = _ACCESS.search(line)
            if m is not None:
                records.append(MotoRequest(m[1], m[2], int(m[3])))
        return records

    # -- clients and data
    def client(self, region: str = DEFAULT_REGION, *, read_timeout: float = 60.0) -> S3Client:
        """A boto3 client with moto's dummy credentials. Completing a multipart upload of gigabytes makes moto
        copy them in Python: give such clients a longer ``read_timeout`` (a retry after a timeout fails, since
        the first attempt completed the upload meanwhile)."""
        import boto3
        from botocore.config import Config

        client: S3Client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=region,
            aws_access_key_id=DUMMY_KEY_ID,
            aws_secret_access_key=DUMMY_SECRET,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, read_timeout=read_timeout),
        )
        return client


def create_bucket(client: S3Client, bucket: str, region: str = DEFAULT_REGION) -> None:
    """Create ``bucket`` (in ``region``); an existing bucket of ours is fine."""
    try:
        if region == "us-east-1":
            client.create_bucket(Bucket=bucket)
        else:
            client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})  # type: ignore[typeddict-item]
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass


def upload_objects(
    client: S3Client,
    bucket: str,
    objects: Mapping[str, bytes],
    *,
    multipart_threshold: int | None = None,
    part_size: int = 8 * 1024 * 1024,
) -> dict[str, str]:
    """Upload ``objects`` (key -> bytes); return each key's ETag (quotes included).

    Objects of at least ``multipart_threshold`` bytes are uploaded in parts of ``part_size`` (S3 needs at
    least 5 MiB per part but the last), so their ETag ends in ``-<parts>``; the rest with one PUT.
    """
    etags: dict[str, str] = {}
    for key, data in objects.items():
        if multipart_threshold is not None and len(data) >= multipart_threshold:
            upload = client.create_multipart_upload(Bucket=bucket, Key=key)
            parts: list[CompletedPartTypeDef] = []
            for number, start in enumerate(range(0, len(data), part_size), start=1):
                done = client.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload["UploadId"],
                    PartNumber=number,
                    Body=data[start : start + part_size],
                )
                parts.append({"ETag": done["ETag"], "PartNumber": number})
            client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
            )
            etags[key] = client.head_object(Bucket=bucket, Key=key)["ETag"]
        else:
            etags[key] = client.put_object(Bucket=bucket, Key=key, Body=data)["ETag"]
    return etags
