"""Who may use which directory: one owner per directory tree, and trash restored only to its owner.

Role: the decisions, as data. The reconciler states facts — each model's :class:`Claim` (its owner, the
directory it writes or reads, how old it is) — and this module answers:

* :func:`find_conflict`: does an earlier claim of another owner overlap mine (the same directory, a parent
  or a child of it)? Then mine is refused (``PathConflict``) and the earlier model keeps the directory.
* :func:`may_restore`: may a trashed copy be restored to this model? Only to its owner.

Owner identity is the namespace, the storage URI, the Secret name (``spec.storage.key``) and the
parameters: two objects are the same owner only if all four match (a tenant naming the same URI and path
with its own ``endpoint`` is another owner). Rules, for two overlapping claims of different models:

* the first claim blocks the later one, whatever each does with the directory (writing into a tree another
  model reads or writes, or reading another model's tree, is refused); first is the model that already
  holds the directory on this node (its manifest records it), then the older (``creationTimestamp``,
  then key);
* the same owner may share one directory (the same path exactly); a parent or child never is shared, since
  removing the outer one would move the inner one into the trash;
* two read-only (``local://``) claims of ClusterBaseModels may overlap: nothing is written, both are an
  admin's.

Cheap with thousands of models: paths are normalised once per object version, no comparison touches the
file system, and :class:`ClaimIndex` answers "what overlaps this path" with one dict lookup per ancestor
and a bisection into the sorted paths for descendants. :class:`ClaimCache` keeps the claims of the
informer caches and rebuilds the index only when an object changed. Resolving symlinks is the caller's
(:class:`PathGate`), done once per object version.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from model_agent.kube import objects
from model_agent.local.layout import PathRefused
from model_agent.local.manifest import Manifest
from model_agent.model.resources import ModelObject
from model_agent.model.uris import InvalidStorageUri, StorageType, parse_local_uri, storage_type

# Sources whose files the agent writes into the destination; ``local://`` is read in place.
WRITING_TYPES = frozenset(
    {StorageType.HUGGINGFACE, StorageType.OCI, StorageType.S3, StorageType.GCS, StorageType.AZURE}
)
RULE = "one owner per directory tree"
# What the layout refuses in any destination before looking at the disk (control characters).
_UNUSABLE = re.compile(r"[\x00-\x1f\x7f]")


class Mode(StrEnum):
    """What a claim does with its directory: a fetched model writes it, a ``local://`` one only reads it."""

    WRITE = "writes"
    READ = "reads"


class Relation(StrEnum):
    """How my path relates to the other claim's path."""

    SAME = "is"
    INSIDE = "is inside"
    CONTAINS = "contains"


@dataclass(frozen=True)
class Owner:
    """Who a model's files belong to; ``namespace`` is ``""`` for a ClusterBaseModel."""

    namespace: str
    storage_uri: str
    secret: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """A stable digest of the whole identity (what a manifest records as its ``owner``)."""
        ident = [self.namespace, self.storage_uri, self.secret, dict(sorted(self.parameters.items()))]
        return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]

    @property
    def trusted(self) -> bool:
        """A ClusterBaseModel's owner (a cluster admin's): the read-only overlap rule applies only to these."""
        return not self.namespace


@dataclass(frozen=True)
class Claim:
    """One model's use of a directory. ``paths`` are normalised absolute paths: as written, and resolved."""

    key: str
    owner: Owner
    paths: tuple[str, ...]
    mode: Mode
    created: str = ""  # RFC 3339 creationTimestamp; sorts in time order

    @property
    def rank(self) -> tuple[str, str]:
        """The order of precedence between two claims: older first, then by key, so every node decides alike."""
        return (self.created, self.key)


@dataclass(frozen=True)
class Conflict:
    """Why ``mine`` may not have its directory: ``holder`` came first and overlaps it."""

    mine: Claim
    holder: Claim
    relation: Relation
    my_path: str
    their_path: str

    @property
    def message(self) -> str:
        """The refusal as the model's ``PathConflict`` reason says it: which path, whose, and the rule."""
        where = "" if self.relation == Relation.SAME else f" {self.their_path!r},"
        return (
            f"{self.my_path!r} {self.relation.value}{where} the directory that {self.holder.key} "
            f"{self.holder.mode.value} (another owner's model, which came first): {RULE}"
        )


def normalise(raw: str) -> str | None:
    """An absolute path with repeated and trailing slashes collapsed; None when it is not a plain one.

    No file system access. ``.`` and ``..`` segments make a path unusable (the layout refuses them), so
    such a path claims nothing.
    """
    if not raw.startswith("/"):
        return None
    parts = [p for p in raw.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return None
    return "/" + "/".join(parts)


def _ancestors(path: str) -> Iterator[str]:
    while path != "/":
        path = path.rsplit("/", 1)[0] or "/"
        yield path


class ClaimIndex:
    """Every claim by each of its paths, and the paths sorted (a child sorts right after its parent)."""

    def __init__(self, claims: Iterable[Claim] = ()) -> None:
        self._by_path: dict[str, list[Claim]] = {}
        for claim in claims:
            for path in claim.paths:
                self._by_path.setdefault(path, []).append(claim)
        self._sorted = sorted(self._by_path)

    def __len__(self) -> int:
        return len(self._by_path)

    def add(self, claim: Claim) -> None:
        """Index ``claim`` under each of its paths."""
        for path in claim.paths:
            holders = self._by_path.setdefault(path, [])
            if not holders:
                bisect.insort(self._sorted, path)
            holders.append(claim)

    def discard(self, claim: Claim) -> None:
        """Remove this very claim (by identity: claims are compared field by field otherwise)."""
        for path in claim.paths:
            holders = [c for c in self._by_path.get(path, ()) if c is not claim]
            if holders:
                self._by_path[path] = holders
            elif self._by_path.pop(path, None) is not None:
                i = bisect.bisect_left(self._sorted, path)
                if i < len(self._sorted) and self._sorted[i] == path:
                    del self._sorted[i]

    def overlapping(self, path: str) -> Iterator[tuple[Relation, str, Claim]]:
        """Claims with a path equal to, above or below ``path`` (each with that path)."""
        for claim in self._by_path.get(path, ()):
            yield Relation.SAME, path, claim
        for above in _ancestors(path):
            for claim in self._by_path.get(above, ()):
                yield Relation.INSIDE, above, claim
        prefix = path if path == "/" else path + "/"
        i = bisect.bisect_left(self._sorted, prefix)
        while i < len(self._sorted) and self._sorted[i].startswith(prefix):
            below = self._sorted[i]
            if below != path:
                for claim in self._by_path[below]:
                    yield Relation.CONTAINS, below, claim
            i += 1


def may_share(mine: Claim, other: Claim, relation: Relation) -> bool:
    """Whether two overlapping claims of different models may both stand, whichever came first."""
    if relation == Relation.SAME and other.owner == mine.owner:
        return True
    return mine.mode == other.mode == Mode.READ and mine.owner.trusted and other.owner.trusted


def find_conflict(
    mine: Claim,
    index: ClaimIndex,
    *,
    live_here: Callable[[Claim], bool] = lambda _c: True,
    holds: Callable[[Claim], bool] = lambda _c: False,
) -> Conflict | None:
    """The first claim that keeps ``mine`` out, or None.

    Which claim comes first: the one that already holds the directory on this node (``holds``: its
    manifest records it), then the older (creationTimestamp, then key). Holding goes first because a
    directory with published weights must not change hands: the newcomer would publish around the
    holder's files, and removing the holder later would move the newcomer's weights into the trash; and
    creationTimestamp has one-second steps, so "older" alone would let a model created in the same second
    with a smaller name take a Ready model's directory.

    ``live_here`` and ``holds`` are asked only about claims that overlap (so they may be slower, e.g. parse
    the object, test its node selection or read its manifest): a model that does not use this node holds
    nothing here.
    """
    held: dict[str, bool] = {}

    def order(claim: Claim) -> tuple[bool, tuple[str, str]]:
        if claim.key not in held:
            held[claim.key] = holds(claim)
        return (not held[claim.key], claim.rank)

    found: Conflict | None = None
    for my_path in mine.paths:
        for relation, their_path, other in index.overlapping(my_path):
            if other.key == mine.key or may_share(mine, other, relation):
                continue
            if order(other) > order(mine):
                continue
            if found is not None and order(other) >= order(found.holder):
                continue
            if live_here(other):
                found = Conflict(mine, other, relation, my_path, their_path)
    return found


def may_restore(entry_key: str, entry_owner: str, claimant_key: str, claimant: Owner) -> bool:
    """Whether a trashed copy (of ``entry_key``, fetched by the owner fingerprint ``entry_owner``) may go back.

    Only to its owner: the same model key, or the same owner identity (namespace, URI, Secret name and
    parameters). A copy trashed before owners were recorded (``entry_owner == ""``) goes back only to its
    own key. Anyone else fetches.
    """
    if entry_key == claimant_key:
        return True
    return bool(entry_owner) and entry_owner == claimant.fingerprint


def restorable_by(obj: ModelObject) -> Callable[[Manifest], bool]:
    """The trash's ``accept`` filter for ``obj``: a trashed manifest goes back only to its owner."""
    claimant = owner_of_model(obj)
    return lambda manifest: may_restore(manifest.key, manifest.owner, obj.ref.key, claimant)


def restorable_to(key: str, raw: Mapping[str, Any] | None) -> Callable[[Manifest], bool]:
    """:func:`restorable_by` for the cached raw object of model ``key`` (``Kind/namespace/name``)."""
    spec = (raw or {}).get("spec") or {}
    claimant = owner_of(key.split("/", 2)[1], spec.get("storage") or {})
    return lambda manifest: may_restore(manifest.key, manifest.owner, key, claimant)


def owner_of_model(obj: ModelObject) -> Owner:
    """The owner identity of ``obj``: namespace, storage URI, Secret name and parameters, all four."""
    storage = obj.spec.storage
    return Owner(obj.ref.namespace, storage.storage_uri, storage.key or "", dict(storage.parameters))


# --------------------------------------------------------------------------- claims of cached objects


class PathGate(Protocol):
    """The layout's checks, which may touch the file system (resolving symlinks): called once per version.

    ``writable`` takes a resolved, normalised path and uses no I/O: a claim of a fetched model costs one
    ``realpath``, not the whole of ``confine`` (a fifth of the time; 5,000 models are derived at start-up).
    """

    def writable(self, resolved: str) -> bool:
        """Whether a fetched model may write at ``resolved`` (inside a root, not a root, not the private area)."""

    def check_local(self, raw: str, *, tenant: bool = False) -> Path:
        """A ``local://`` path as given once it passes the checks, else ``PathRefused`` (stricter for tenants)."""

    def resolve(self, raw: str) -> str:
        """``raw`` normalised with symlinks resolved: the identity two spellings of one directory share."""


def owner_of(namespace: str, storage: Mapping[str, Any]) -> Owner:
    """The owner of a model from its namespace and raw ``spec.storage``."""
    params = storage.get("parameters")
    key = storage.get("key")
    return Owner(
        namespace=namespace,
        storage_uri=str(storage.get("storageUri") or ""),
        secret=key if isinstance(key, str) else "",
        parameters=dict(params) if isinstance(params, Mapping) else {},
    )


def claim_of(kind: str, raw: Mapping[str, Any], gate: PathGate) -> Claim | None:
    """The directory a cached model object would use on this node, or None when it would use none.

    None for a source that writes and reads nothing here (vendor, pvc, unsupported types), and for a path
    the layout refuses: a model whose own path is refused holds no directory and blocks no one.
    """
    spec = raw.get("spec") or {}
    storage = spec.get("storage") if isinstance(spec, Mapping) else None
    if not isinstance(storage, Mapping):
        return None
    uri, path = storage.get("storageUri"), storage.get("path")
    if not isinstance(uri, str) or not (path is None or isinstance(path, str)):
        return None
    namespace = objects.namespace(raw) if kind != "ClusterBaseModel" else ""
    key = f"{kind}/{namespace}/{objects.name(raw)}"
    try:
        stype = storage_type(uri)
        if stype == StorageType.LOCAL and not path:
            path = parse_local_uri(uri).path
    except InvalidStorageUri:
        return None
    written = normalise(path or "")
    if written is None or stype not in WRITING_TYPES | {StorageType.LOCAL}:
        return None
    try:
        if stype == StorageType.LOCAL:
            gate.check_local(path or "", tenant=bool(namespace))
            resolved = normalise(gate.resolve(written)) or written
            mode = Mode.READ
        else:
            if _UNUSABLE.search(path or "") or len((path or "").encode("utf-8", "surrogatepass")) > 4096:
                return None
            resolved = normalise(gate.resolve(written)) or ""
            if not gate.writable(resolved):
                return None
            mode = Mode.WRITE
    except (PathRefused, OSError, ValueError):  # refused (or unresolvable): this model holds no directory
        return None
    paths = (written,) if resolved == written else (written, resolved)
    created = str(objects.meta(raw).get("creationTimestamp") or "")
    return Claim(key, owner_of(namespace, storage), paths, mode, created)


def _version(kind: str, raw: Mapping[str, Any]) -> tuple[str, str, str]:
    return (kind, objects.namespace(raw), f"{objects.name(raw)}@{objects.resource_version(raw)}")


class ClaimCache:
    """The claims of every model in the informer caches, and their index, kept up to date incrementally.

    :meth:`index` compares the identities of the cached objects with the last call's (C-speed set
    operations: the informers replace an object's dict on every change); only objects that came or went are
    looked at. A claim is derived (through the gate) once per object version: after a relist, which brings
    new dicts of unchanged versions, the claims are reused.
    """

    def __init__(self, gate: PathGate) -> None:
        self.gate = gate
        # kind -> id(object) -> (object, its claim); holding the object keeps its id its own
        self._objects: dict[str, dict[int, tuple[Any, Claim | None]]] = {}
        self._index = ClaimIndex()

    def index(self, stores: Mapping[str, Any]) -> ClaimIndex:
        """``stores`` maps a kind to a store with ``values()`` (raw object dicts)."""
        for kind, store in stores.items():
            objs = list(store.values())
            current = dict(zip(map(id, objs), objs, strict=True))
            known = self._objects.setdefault(kind, {})
            if current.keys() == known.keys():
                continue
            gone = [known.pop(i) for i in known.keys() - current.keys()]
            reusable = {_version(kind, obj): claim for obj, claim in gone}
            for _, claim in gone:
                if claim is not None:
                    self._index.discard(claim)
            for i in current.keys() - known.keys():
                obj = current[i]
                version = _version(kind, obj)
                claim = reusable[version] if version in reusable else claim_of(kind, obj, self.gate)
                known[i] = (obj, claim)
                if claim is not None:
                    self._index.add(claim)
        return self._index
