"""Records of shared-artifact links: which model's ``spec.storage.path`` is a symlink to which parent.

Role: the durable half of ``agent/artifact_reuse.py``. A model that shares a Hugging Face snapshot has a
manifest naming the parent directory (``_artifacts/<model-id>/<commit>``), like any fetched model; the link
at its own path is recorded here, before it is made, so that a removal (possibly after a restart, with the
object long gone) removes exactly that link and nothing else.

Contract: one JSON file per model key under ``<records>/links/`` of the primary root (``--state-dir`` when
given), written atomically (temp file, fsync, rename); :meth:`LinkRecords.load` answers ``None`` for a
missing or garbled record, never raises for one.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from model_agent.local.layout import Layout, token_for
from model_agent.local.manifest import write_atomic
from model_agent.model import json_text


class LinkRecords:
    def __init__(self, layout: Layout) -> None:
        self.directory = layout.primary.records / "links"

    def _file(self, key: str) -> Path:
        return self.directory / f"{token_for(key)}.json"

    def save(self, key: str, link: Path, parent: Path) -> None:
        current = self.load(key)
        if current == (link, parent):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"key": key, "link": str(link), "parent": str(parent)}, sort_keys=True)
        write_atomic(self._file(key), body.encode())

    def load(self, key: str) -> tuple[Path, Path] | None:
        try:
            doc = json_text.loads(self._file(key).read_text())
            if doc.get("key") != key:
                return None
            return Path(str(doc["link"])), Path(str(doc["parent"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._file(key).unlink()
