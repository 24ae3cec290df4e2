"""A listing's caps: objects, name length, total name bytes, pages; each refusal names the cap."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from model_agent.sources.base import SourceError
from model_agent.sources.listing import ListingBudget
from model_agent.sources.s3 import S3Settings, S3Source


def test_a_listing_within_the_caps_passes() -> None:
    budget = ListingBudget("s3://b/p", max_objects=3, max_name_bytes=100, max_pages=2)
    budget.page()
    for key in ("p/a", "p/b", "p/c"):
        budget.item(key)
    assert (budget.objects, budget.pages) == (3, 1)


@pytest.mark.parametrize(
    ("caps", "keys", "pages", "what"),
    [
        ({"max_objects": 2}, ["a", "b", "c"], 1, "more than 2 objects"),
        ({"max_key_bytes": 8}, ["123456789"], 1, "an object name of 9 bytes"),
        ({"max_key_bytes": 8}, ["ééééé"], 1, "an object name of 10 bytes"),  # bytes, not characters
        ({"max_name_bytes": 5}, ["abc", "def"], 1, "more than 5 bytes of object names"),
        ({"max_pages": 3}, [], 4, "more than 3 pages"),
    ],
)
def test_each_cap_refuses_with_a_reason(caps: dict[str, int], keys: list[str], pages: int, what: str) -> None:
    budget = ListingBudget("gs://bucket/prefix", **caps)
    with pytest.raises(SourceError) as info:
        for _ in range(pages):
            budget.page()
        for key in keys:
            budget.item(key)
    assert info.value.reason == "ListingTooLarge"
    assert not info.value.retryable
    assert what in info.value.message and "gs://bucket/prefix" in info.value.message


class _EndlessListing(BaseHTTPRequestHandler):
    """A hostile S3 endpoint: every ListObjectsV2 page is full and truncated, with a fresh token, forever."""

    pages = 0

    def do_GET(self) -> None:
        type(self).pages += 1
        n = type(self).pages
        keys = "".join(
            f"<Contents><Key>p/{n:08d}-{i:04d}-x</Key><Size>1</Size><ETag>&quot;e&quot;</ETag></Contents>"
            for i in range(1000)
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><Prefix>p/</Prefix>'
            f"<KeyCount>1000</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
            f"<NextContinuationToken>t{n}</NextContinuationToken>{keys}</ListBucketResult>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def test_an_endless_s3_pagination_is_refused_in_bounded_memory() -> None:
    import boto3
    from botocore.config import Config

    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessListing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{server.server_port}",
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        settings = S3Settings("b", "p/", "us-east-1", None, "path", False, None)
        with pytest.raises(SourceError) as info:
            S3Source().list_objects(client, settings)
    finally:
        server.shutdown()
        server.server_close()
    assert info.value.reason == "ListingTooLarge" and "objects" in info.value.message
    # Stopped at the object cap (what it holds is bounded by the caps), not at the end of the server's patience.
    assert _EndlessListing.pages <= 101
