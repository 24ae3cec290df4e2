"""A listing's caps: objects, name length, total name bytes, pages; each refusal names the cap."""

from __future__ import annotations

import pytest

from model_agent.sources.base import SourceError
from model_agent.sources.listing import ListingBudget


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
