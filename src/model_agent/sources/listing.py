"""Bounds on one object-store listing: a bucket (or a server posing as one) cannot exhaust the agent.

Role: every object-store source (``s3://``, ``gs://``, ``az://``, ``oci://``) lists a prefix page by page and
keeps what it finds in memory until the fetch is planned. The store's answers are input like any other: a
tenant may point a model at a bucket with millions of objects, or at an endpoint whose pagination never
ends (each page hands out a new continuation token), and one such object selecting every node would take
the agent past its memory limit on all of them at once (an endless S3 pagination reached 738 MiB in 20 s).

Contract: a source makes one :class:`ListingBudget` per listing and calls :meth:`ListingBudget.page` for each
page it receives and :meth:`ListingBudget.item` for each object name before it keeps anything of it. When a
cap is passed the budget raises :class:`~model_agent.sources.base.SourceError` with reason
``ListingTooLarge`` (not retryable: the same listing would fail the same way), which the reconciler shows as
``Failed`` with that reason. The caps are generous for real models — the largest public checkpoints have a
few thousand files — and bound what one listing can hold to about :data:`MAX_LISTING_NAME_BYTES` of names
plus a fixed cost per object.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Final

from model_agent.model.reasons import Reason
from model_agent.sources.base import SourceError

MAX_LISTED_OBJECTS: Final = 100_000
"""Objects (folder markers included) one listing may return."""
MAX_KEY_BYTES: Final = 4096
"""Bytes of one object name (S3 allows 1,024, GCS 1,024, Azure 1,024 characters, OCI 1,024)."""
MAX_LISTING_NAME_BYTES: Final = 64 * 1024 * 1024
"""Bytes of all object names of one listing together."""
MAX_LISTING_PAGES: Final = 10_000
"""Pages one listing may take (a server that never stops paginating, even with empty pages)."""


@dataclass(eq=False)
class ListingBudget:
    """Counts one listing against the caps; raises ``SourceError("ListingTooLarge")`` past any of them."""

    label: str
    _: KW_ONLY
    max_objects: int = MAX_LISTED_OBJECTS
    max_key_bytes: int = MAX_KEY_BYTES
    max_name_bytes: int = MAX_LISTING_NAME_BYTES
    max_pages: int = MAX_LISTING_PAGES
    objects: int = field(default=0, init=False)
    name_bytes: int = field(default=0, init=False)
    pages: int = field(default=0, init=False)

    def page(self) -> None:
        """One more page received."""
        self.pages += 1
        if self.pages > self.max_pages:
            self._refuse(f"more than {self.max_pages} pages")

    def item(self, key: str) -> None:
        """One more object named ``key`` listed; call before keeping anything of it."""
        size = len(key.encode("utf-8", "surrogatepass"))
        if size > self.max_key_bytes:
            self._refuse(f"an object name of {size} bytes (limit {self.max_key_bytes})")
        self.objects += 1
        self.name_bytes += size
        if self.objects > self.max_objects:
            self._refuse(f"more than {self.max_objects} objects")
        if self.name_bytes > self.max_name_bytes:
            self._refuse(f"more than {self.max_name_bytes} bytes of object names")

    def _refuse(self, what: str) -> None:
        raise SourceError(
            Reason.LISTING_TOO_LARGE,
            f"{self.label}: the listing has {what}; point the model at a prefix that holds one model",
            retryable=False,
        )
