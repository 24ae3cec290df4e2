"""Shared Hugging Face artifacts: ``downloadPolicy: ReuseIfExists`` (OME #734 and follow-ups).

Role: decide whether a model shares one node-local copy of a Hugging Face snapshot with other models, and
carry the few acts that sharing adds to the ordinary fetch-and-publish path.

Layout (as OME's agent lays it out): the snapshot ``<model-id>@<commit>`` is fetched once into the *parent*
``<dir of spec.storage.path>/_artifacts/<model-id>/<commit>``; each model's ``spec.storage.path`` is a
relative symlink (a *child*) to it. The parent is the model's destination for everything the agent does —
its manifest, its stat and hash checks, the one destructive path — so the invariants hold unchanged: every
model that shares a parent has its own manifest naming it, a removal keeps it while another live model
resolves to it, and the last removal moves it into the trash once (``agent/removal.py``).

Contract:

* :func:`plan_sharing` is the decision, a pure function of :class:`SharingFacts` (table-tested). A model
  shares only when all hold: ``downloadPolicy: ReuseIfExists``; an ``hf://`` source; a ClusterBaseModel
  (its author is a cluster admin — a tenant's copy is never handed to another owner, whose token might not
  see a gated repository); an explicit ``spec.storage.path`` with no ``_artifacts`` component; no real
  directory or file already at that path (an unshared copy is never adopted or overwritten); and an
  immutable identity: the repository id and a 40-hex commit, from the ``hf-model-id`` / ``hf-model-sha``
  annotations or the URI's own ``@<commit>``, the two agreeing when both are given. Anything else fetches as
  before, with the reason logged. Unlike OME the agent does not ask the hub which commit a branch names to
  decide the layout: the identity must be written down.
* A shared model's target is the pinned source ``hf://<model-id>@<commit>`` at the parent, so models of one
  identity have the same target: the second adopts the first one's verified copy (a manifest of its own,
  no download), or waits while the first one fetches (:func:`sibling_state`).
* :func:`link_child` makes the child symlink, relative, by an atomic rename over whatever symlink was there
  (never over a directory or file); :func:`release_child` removes it only if it still points at the parent.
  When a model moves to another commit, its link is pointed at the new parent before the old one is retired
  (after the new copy's publish, or before adopting a sibling's): the path always leads to weights.
  Both keep a record per model (``local/artifacts.py``) so a removal finds the link after the object is gone.
* :func:`parent_of_spec` maps a live object's raw spec to its parent (for the destructive path's "another
  live model uses this path" check, before its link exists).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import structlog

from model_agent.kube import objects
from model_agent.local.artifacts import LinkRecords
from model_agent.local.layout import Layout, PathRefused
from model_agent.local.manifest import Manifest, ManifestStore

log = structlog.get_logger(__name__)

ANNOTATION_MODEL_ID = "hf-model-id"
ANNOTATION_COMMIT = "hf-model-sha"
ARTIFACTS_DIR = "_artifacts"
CONFIGMAP_KEY_PREFIX = "artifact.huggingface."
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")
_ID_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class LinkState(Enum):
    """What is at ``spec.storage.path`` on disk."""

    ABSENT = "absent"
    SYMLINK = "symlink"  # a symlink, wherever it points: ours to replace
    OCCUPIED = "occupied"  # a real directory or file: never taken over


@dataclass(frozen=True)
class SharingFacts:
    reuse_policy: bool  # spec.storage.downloadPolicy is ReuseIfExists
    hf_source: bool
    cluster_scoped: bool
    path: str  # spec.storage.path as written ("" when unset)
    uri_repo: str
    uri_revision: str
    annotated_id: str  # "" when the annotation is absent
    annotated_commit: str
    link: LinkState


@dataclass(frozen=True)
class Identity:
    """An immutable Hugging Face snapshot: repository id and commit (lower case)."""

    model_id: str
    commit: str

    @property
    def pinned_uri(self) -> str:
        return f"hf://{self.model_id}@{self.commit}"

    def parent_next_to(self, link: Path) -> Path:
        return link.parent / ARTIFACTS_DIR / self.model_id / self.commit


@dataclass(frozen=True)
class SharingPlan:
    identity: Identity | None  # None: fetch as an ordinary model
    why_not: str = ""


def plan_sharing(facts: SharingFacts) -> SharingPlan:
    """Whether (and as what identity) a model shares its snapshot; see the module contract."""

    def no(why: str) -> SharingPlan:
        return SharingPlan(None, why)

    if not facts.reuse_policy:
        return no("downloadPolicy is not ReuseIfExists")
    if not facts.hf_source:
        return no("only hf:// sources are shared")
    if not facts.cluster_scoped:
        return no("only ClusterBaseModels share artifacts (a tenant's copy is never handed to another owner)")
    if not facts.path:
        return no("spec.storage.path is not set")
    if ARTIFACTS_DIR in facts.path.split("/"):
        return no(f"spec.storage.path has a {ARTIFACTS_DIR!r} component")
    if facts.link == LinkState.OCCUPIED:
        return no("a directory or file already exists at spec.storage.path (an unshared copy is never adopted)")
    model_id = facts.annotated_id or facts.uri_repo
    if facts.annotated_id and facts.annotated_id != facts.uri_repo:
        return no(f"annotation {ANNOTATION_MODEL_ID} names {facts.annotated_id!r}, the source {facts.uri_repo!r}")
    segments = model_id.split("/")
    if not 1 <= len(segments) <= 2 or not all(_ID_SEGMENT.fullmatch(s) and ".." not in s for s in segments):
        return no(f"{model_id!r} is not a Hugging Face model id")
    uri_commit = facts.uri_revision if _COMMIT.fullmatch(facts.uri_revision) else ""
    if facts.annotated_commit and not _COMMIT.fullmatch(facts.annotated_commit):
        return no(f"annotation {ANNOTATION_COMMIT} is not a 40-character commit sha")
    if facts.annotated_commit and uri_commit and facts.annotated_commit.lower() != uri_commit.lower():
        return no(f"annotation {ANNOTATION_COMMIT} and the source's revision name different commits")
    commit = (facts.annotated_commit or uri_commit).lower()
    if not commit:
        return no(f"no commit: pin the source (@<commit>) or annotate {ANNOTATION_COMMIT}")
    return SharingPlan(Identity(model_id, commit))


def link_state(path: Path) -> LinkState:
    if path.is_symlink():
        return LinkState.SYMLINK
    return LinkState.OCCUPIED if os.path.lexists(path) else LinkState.ABSENT


def child_path(raw: str) -> Path:
    """``spec.storage.path`` with its directory resolved and its last component kept (the link itself)."""
    collapsed = "/" + "/".join(part for part in raw.split("/") if part)
    path = Path(collapsed)
    return Path(os.path.realpath(path.parent)) / path.name


def facts_of(raw_obj: dict[str, Any], *, cluster_scoped: bool) -> tuple[SharingFacts, Path | None]:
    """The facts for a raw model object (and its child path, if it has one). Reads only the link's lstat."""
    annotations = objects.annotations_of(raw_obj)
    storage = (raw_obj.get("spec") or {}).get("storage") or {}
    uri = str(storage.get("storageUri") or "")
    path = storage.get("path") or ""
    path = path if isinstance(path, str) else ""
    repo, _, revision = uri.removeprefix("hf://").partition("@")
    link = child_path(path) if path.startswith("/") else None
    facts = SharingFacts(
        reuse_policy=storage.get("downloadPolicy") == "ReuseIfExists",
        hf_source=uri.startswith("hf://"),
        cluster_scoped=cluster_scoped,
        path=path,
        uri_repo=repo,
        uri_revision=revision,
        annotated_id=annotations.get(ANNOTATION_MODEL_ID, ""),
        annotated_commit=annotations.get(ANNOTATION_COMMIT, ""),
        link=link_state(link) if link is not None else LinkState.ABSENT,
    )
    return facts, link


@dataclass(frozen=True)
class SharedTarget:
    identity: Identity
    parent: Path
    link: Path


def shared_target(raw_obj: dict[str, Any], layout: Layout, *, cluster_scoped: bool) -> SharedTarget | None:
    """The shared parent and child of a model, or None when it fetches as an ordinary model.

    The parent must be confined like any destination (inside an allowed root, outside the private area).
    """
    storage = (raw_obj.get("spec") or {}).get("storage") or {}
    if storage.get("downloadPolicy") != "ReuseIfExists":
        return None  # the common case, decided without touching the disk
    facts, link = facts_of(raw_obj, cluster_scoped=cluster_scoped)
    plan = plan_sharing(facts)
    if plan.identity is None or link is None:
        if facts.reuse_policy:
            log.debug("ReuseIfExists without sharing", why=plan.why_not)
        return None
    parent = plan.identity.parent_next_to(link)
    try:
        _, parent = layout.confine(str(parent))
    except PathRefused as exc:
        log.info("ReuseIfExists without sharing: the parent is refused", why=str(exc))
        return None
    return SharedTarget(plan.identity, parent, link)


def parent_of_spec(raw_obj: dict[str, Any], layout: Layout) -> Path | None:
    """For the destructive path: the parent a live object's spec shares, if it shares one.

    Asked for every cached model on each removal decision: a model without ``ReuseIfExists`` costs no I/O.
    """
    storage = (raw_obj.get("spec") or {}).get("storage") or {}
    if storage.get("downloadPolicy") != "ReuseIfExists":
        return None
    cluster_scoped = raw_obj.get("kind") == "ClusterBaseModel"
    target = shared_target(raw_obj, layout, cluster_scoped=cluster_scoped)
    return target.parent if target is not None else None


class Sibling(Enum):
    NONE = "none"  # nobody holds this artifact: fetch it
    COPY = "copy"  # another model holds a verified copy: adopt it
    FETCHING = "fetching"  # another model is fetching it: wait


def sibling_state(
    key: str, storage_uri: str, parent: Path, manifests: ManifestStore, fetching: set[str]
) -> tuple[Sibling, Manifest | None]:
    """Who else holds (or is fetching) the artifact at ``parent``; ``fetching`` are the keys fetching it."""
    for manifest in manifests.all():
        if manifest.key == key or manifest.removing:
            continue
        if manifest.storage_uri == storage_uri and Path(manifest.dest) == parent and not manifest.fast_check():
            return Sibling.COPY, manifest
    if fetching - {key}:
        return Sibling.FETCHING, None
    return Sibling.NONE, None


def adopt_copy(sibling: Manifest, key: str, uid: str, owner: str, generation: int) -> Manifest:
    """This model's own record of a sibling's verified copy (the same files, its own identity)."""
    return Manifest(
        key=key,
        uid=uid,
        storage_uri=sibling.storage_uri,
        dest=sibling.dest,
        revision=sibling.revision,
        generation=generation,
        source_type=sibling.source_type,
        owned=True,
        files=list(sibling.files),
        metadata=sibling.metadata,
        published_at=sibling.published_at,
        verified_at=sibling.verified_at,
        owner=owner,
    )


def link_child(layout: Layout, key: str, link: Path, parent: Path) -> None:
    """Point ``link`` at ``parent`` (relative), recording it first; PathRefused if a non-link stands there."""
    records = LinkRecords(layout)
    records.save(key, link, parent)
    if link.is_symlink() and os.path.realpath(link) == str(parent):
        return
    if os.path.lexists(link) and not link.is_symlink():
        raise PathRefused(f"{link} is a directory or file, not a link to the shared artifact {parent}")
    link.parent.mkdir(parents=True, exist_ok=True)
    # Per node and process: two nodes relinking one path on a shared root must not race on one temporary name.
    temporary = link.parent / f".{link.name}.{socket.gethostname()}.{os.getpid()}.artifact-link"
    if temporary.is_symlink():
        temporary.unlink()
    temporary.symlink_to(os.path.relpath(parent, link.parent))
    os.replace(temporary, link)  # atomic: a reader sees the old link or the new one, never none
    log.info("shared artifact linked", key=key, link=str(link), parent=str(parent))


def release_child(layout: Layout, key: str) -> None:
    """Remove ``key``'s child link if it still points at its parent, then its record (idempotent)."""
    records = LinkRecords(layout)
    record = records.load(key)
    if record is None:
        return
    link, parent = record
    if link.is_symlink() and os.path.realpath(link) == str(parent):
        link.unlink()
        log.info("shared artifact link removed", key=key, link=str(link), parent=str(parent))
    records.delete(key)


# The artifact (pinned URI|parent) a model is about to fetch -> (its key, when it claimed it). A claim holds while
# the claimer's fetch job runs, or for CLAIM_S after the claim (the time to reach the fetcher); one event loop
# runs every reconcile, so a plain dict is enough. A fetch that fails lets the claim lapse: another model may try.
_claims: dict[str, tuple[str, float]] = {}
CLAIM_S = 10.0


@dataclass(frozen=True)
class Adoption:
    manifest: Manifest | None  # this model's record to converge with (possibly adopted just now)
    wait: bool  # another model is fetching the artifact: show Updating and look again shortly


async def adopt_or_wait(
    manifests: ManifestStore,
    retire: Any,  # async (superseded manifest) -> None: the remover's replace_superseded for this key
    relink: Callable[[], Awaitable[None]],  # point this model's link at the parent (link_child)
    *,
    key: str,
    uid: str,
    owner: str,
    generation: int,
    storage_uri: str,
    parent: Path,
    root: Any,
    manifest: Manifest | None,
    fetching: Callable[[], set[str]],
) -> Adoption:
    """Before converging a shared model without a record of the artifact: adopt a sibling's copy, or wait.

    A record of this model for another target (the spec's identity changed) is retired first, through the
    destructive path (``retire`` raises Requeue while the breaker holds), so one manifest per key still holds.
    The model's link is pointed at the sibling's verified copy before that, so it never leads to a parent that
    has gone to the trash.
    """
    if manifest is not None and manifest.storage_uri == storage_uri and Path(manifest.dest) == parent:
        if manifest.damaged or not await asyncio.to_thread(manifest.fast_check):
            return Adoption(manifest, False)  # intact, or marked damaged by a re-hash: this model refetches
        # The files changed under this record but no re-hash found them bad: a sibling's refetch published into
        # the parent. Its record describes the parent as it is now; take it rather than fetching again (two
        # siblings would otherwise refetch each other's files forever).
        state, sibling = await asyncio.to_thread(sibling_state, key, storage_uri, parent, manifests, set())
        if state != Sibling.COPY or sibling is None:
            return Adoption(manifest, False)
        refreshed = adopt_copy(sibling, key, uid, owner, generation)
        refreshed.reserved = manifest.reserved
        await asyncio.to_thread(manifests.save, refreshed, root)
        log.info("shared artifact record refreshed from a sibling", key=key, parent=str(parent), sibling=sibling.key)
        return Adoption(refreshed, False)
    state, sibling = await asyncio.to_thread(sibling_state, key, storage_uri, parent, manifests, fetching())
    if state == Sibling.FETCHING:
        return Adoption(manifest, True)
    if state == Sibling.NONE or sibling is None:
        # About to fetch: claim the artifact first, with no await between the check and the claim, so two
        # models reconciled at once do not both start a fetch (the other waits, then adopts).
        claim = f"{storage_uri}|{parent}"
        holder = _claims.get(claim)
        now = time.monotonic()
        if holder is not None and holder[0] != key and (holder[0] in fetching() or now - holder[1] < CLAIM_S):
            return Adoption(manifest, True)
        _claims[claim] = (key, now)
        return Adoption(manifest, False)
    if manifest is not None:
        await relink()
        await retire(manifest)
    adopted = adopt_copy(sibling, key, uid, owner, generation)
    await asyncio.to_thread(manifests.save, adopted, root)
    log.info("shared artifact adopted without a download", key=key, parent=str(parent), sibling=sibling.key)
    return Adoption(adopted, False)
