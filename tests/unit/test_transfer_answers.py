"""What an HTTP answer means for a transfer: table-tested over status, Content-Range, length and Retry-After."""

from __future__ import annotations

import pytest

from model_agent.model.errors import SourceError
from model_agent.transfer.answers import Answer, RangeIgnored, Redirected, Retry, check_answer, parse_retry_after

SIZE = 1000


def outcome(answer: Answer, first: int = 100, end: int = 200, *, whole: bool = False) -> str:
    """``read``, ``retry[:seconds]``, ``range-ignored`` or the SourceError's reason."""
    try:
        check_answer(answer, "f", SIZE, first, end, whole=whole)
    except Retry as exc:
        return "retry" if exc.retry_after is None else f"retry:{exc.retry_after:g}"
    except RangeIgnored:
        return "range-ignored"
    except Redirected as exc:
        return f"redirected:{exc.reason}"
    except SourceError as exc:
        return exc.reason
    return "read"


@pytest.mark.parametrize(
    ("answer", "whole", "expected"),
    [
        (Answer(206, "bytes 100-199/1000"), False, "read"),
        (Answer(206, "bytes 100-199/*"), False, "read"),
        (Answer(206, "bytes 100-199/2000"), False, "SourceChanged"),  # the file grew since the listing
        (Answer(206, "bytes 100-299/1000"), False, "BadResponse"),  # more than asked: never written past a part
        (Answer(206, "bytes 0-99/1000"), False, "BadResponse"),
        (Answer(206, None), False, "BadResponse"),
        (Answer(200, content_length=SIZE), False, "range-ignored"),
        (Answer(200, content_length=SIZE), True, "read"),
        (Answer(200, content_length=None), True, "read"),  # chunked: the size is checked after the body
        (Answer(200, content_length=SIZE + 1), True, "SourceChanged"),
        (Answer(429, retry_after="7"), False, "retry:7"),
        (Answer(503), False, "retry"),
        (Answer(500), False, "retry"),
        (Answer(408), False, "retry"),
        (Answer(412), False, "SourceChanged"),  # If-Match failed: the ETag moved on
        (Answer(416), False, "SourceChanged"),
        (Answer(401), False, "AccessDenied"),
        (Answer(403), False, "AccessDenied"),
        (Answer(404), False, "ObjectNotFound"),
        (Answer(302), False, "redirected:HttpError"),  # redirects are never followed: the caller may look it up
        (Answer(301), True, "redirected:HttpError"),
        (Answer(307), False, "redirected:HttpError"),
        (Answer(308), True, "redirected:HttpError"),
        (Answer(304), False, "HttpError"),  # not a redirect to anywhere
    ],
)
def test_answer_decisions(answer: Answer, whole: bool, expected: str) -> None:
    assert outcome(answer, whole=whole) == expected


def test_retry_after_parsing() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    when = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert parse_retry_after(when, now=1445412480 - 30) == pytest.approx(30.0)
