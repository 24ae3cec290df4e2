"""The part map: which parts of a file are on disk, persisted so a restart fetches only the others.

Role: the resume record of one file. JSON with the size, the part size, the source's validator (e.g. an
ETag), a bitmap of completed parts and, once the file is verified, ``complete`` with its digests. It is
replaced atomically (temp file + rename): a crash leaves the old map or the new one, never a mix. What it
claims is only ever what the engine has written (and, when durable, fdatasync-ed) before it recorded it;
a map that cannot be read, or is of another version, is trusted for nothing.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from model_agent.model import json_text
from model_agent.transfer.disk import open_making_folders

STATE_VERSION = 1

# Where sources keep part maps in a model's staging folder (removed with it when the model is published).
PARTS_DIR = Path(".cache") / "model-agent" / "parts"


def part_map_path(staging: Path, rel: str) -> Path:
    """The part map of staged file ``rel``: named by a hash, so any file name fits and none can escape."""
    return staging / PARTS_DIR / part_map_name(rel)


def part_map_name(rel: str) -> str:
    """The map's file name for ``rel`` (a hash: S3 and the tests find a file's map by it)."""
    return hashlib.sha256(rel.encode()).hexdigest()[:32] + ".json"


@dataclass
class PartMap:
    """The progress of one file in memory; :meth:`save` and :meth:`load` are its only form on disk."""

    size: int
    part_size: int
    validator: str | None
    done: bytearray  # one bit per part
    complete: bool = False
    digests: dict[str, str] = field(default_factory=dict)

    @property
    def parts(self) -> int:
        return (self.size + self.part_size - 1) // self.part_size

    def is_done(self, i: int) -> bool:
        return bool(self.done[i >> 3] & (1 << (i & 7)))

    def mark(self, i: int) -> None:
        self.done[i >> 3] |= 1 << (i & 7)

    def done_bytes(self) -> int:
        return sum(min(self.part_size, self.size - i * self.part_size) for i in range(self.parts) if self.is_done(i))

    @classmethod
    def fresh(cls, size: int, part_size: int, validator: str | None) -> PartMap:
        return cls(size, part_size, validator, bytearray((((size + part_size - 1) // part_size) + 7) // 8))

    def copy(self) -> PartMap:
        return PartMap(
            self.size, self.part_size, self.validator, bytearray(self.done), self.complete, dict(self.digests)
        )

    def to_json(self) -> bytes:
        doc = {
            "version": STATE_VERSION,
            "size": self.size,
            "part_size": self.part_size,
            "validator": self.validator,
            "done": base64.b64encode(bytes(self.done)).decode(),
            "complete": self.complete,
            "digests": self.digests,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def load(cls, path: Path) -> PartMap | None:
        """The map at ``path``, or None when it is missing or unreadable (then nothing is trusted)."""
        try:
            return cls.read(path)
        except FileNotFoundError:
            return None

    @classmethod
    def read(cls, path: Path) -> PartMap | None:
        """As :meth:`load`, but a missing map raises FileNotFoundError: the caller then knows no file is there
        to remove (an unreadable one is None, and is in the way of the next map)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise
        except OSError:
            return None
        try:
            doc = json_text.loads(raw)
            if doc.get("version") != STATE_VERSION:
                return None
            size, part_size = int(doc["size"]), int(doc["part_size"])
            validator = doc.get("validator")
            done = bytearray(base64.b64decode(doc["done"], validate=True))
            digests = {str(k): str(v) for k, v in dict(doc.get("digests") or {}).items()}
            complete = bool(doc.get("complete", False))
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            return None  # (OverflowError: int(1e999))
        if size < 0 or part_size < 1 or (validator is not None and not isinstance(validator, str)):
            return None
        state = cls(size, part_size, validator, done, complete, digests)
        if len(done) != (state.parts + 7) // 8:
            return None
        return state

    def save(self, path: Path) -> None:
        """Replace the map atomically (a crash leaves the old map or the new one, never a mix)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            try:
                fh = tmp.open("wb")
            except FileNotFoundError:  # the first map of its folder
                path.parent.mkdir(parents=True, exist_ok=True)
                fh = tmp.open("wb")
            with fh:
                fh.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def create(self, path: Path) -> None:
        """Write the map where none is (the caller removed it or found none): one new file, without :meth:`save`'s
        temporary and rename. A crash while writing leaves a partial map, which :meth:`load` trusts for nothing:
        the same as no map. Where one is after all, :meth:`save` replaces it."""
        data = self.to_json()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = open_making_folders(path, flags)  # (the first map of its folder makes it)
        except FileExistsError:
            self.save(path)
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        finally:
            os.close(fd)
