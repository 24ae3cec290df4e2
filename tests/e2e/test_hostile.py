"""Hostile input and secrets, end to end (real API server, real olah mirror, the agent as a subprocess).

A model resource is written by people and pipelines, and the agent runs as root with the host's model
disks mounted. These tests apply a corpus of hostile ClusterBaseModels and BaseModels while a good model
downloads, and check the promises of invariants 6 and 7:

* every hostile object ends ``Failed`` with its own reason (ConfigMap entry ``reason``, Warning Event),
  or, for the few whose outcome is by design not a failure (read-only ``local://`` sources, weights whose
  metadata cannot be parsed), ends as stated with nothing written outside the roots;
* the good model ends Ready; the agent never restarts;
* a sentinel tree outside the models root is byte-for-byte unchanged, and nothing appears outside the
  models root but what the test itself made;
* a token from a Secret or from ``parameters.token`` appears nowhere in the agent's log, the ConfigMap or
  the Events (neither as text nor base64).

Cases the API server rejects at admission (the CRD's schema) are listed as such and do not count: the
agent's own parsers are covered for those by the unit suites.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from model_agent.kube.client import ApiError
from model_agent.kube.resources import EVENTS, SECRETS
from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, bm, cbm
from tests.support.waiting import always, eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
BM = "BaseModel"
AGENT_NAMESPACE = "ome"
DEADLINE_S = 120.0
READY = "Ready"
# pvc:// models are the OME controller's business: no agent selects them, whatever their URI says.
IGNORED = "Ignored"


@dataclass
class Case:
    """One hostile object and what must become of it.

    ``expect`` is ``Ready`` or a reason code; a Failed entry's ``reason`` must start with ``expect + ": "``
    and contain ``contains``. ``alternatives`` lists other acceptable codes (where the mirror's answer is
    not the Hub's)."""

    name: str
    manifest: dict[str, Any]
    expect: str
    contains: str = ""
    alternatives: tuple[str, ...] = ()
    admitted: bool = True
    outcome: str = ""
    settled_after: float | None = None  # seconds after the corpus was applied when it first matched

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"].get("namespace") or "")

    @property
    def label_key(self) -> str:
        return node_label_key(self.kind, self.namespace, self.name)

    @property
    def entry_key(self) -> str:
        return configmap_key(self.kind, self.namespace, self.name)

    def matches(self, label: str | None, entry: dict[str, Any] | None) -> bool:
        if entry is None:
            return self.expect == IGNORED and label is None
        if self.expect == READY:
            return label == READY and entry.get("status") == READY
        if self.expect == IGNORED:
            return label is None
        reason = str(entry.get("reason") or "")
        codes = (self.expect, *self.alternatives)
        return (
            label == "Failed"
            and entry.get("status") == "Failed"
            and any(reason.startswith(code + ": ") for code in codes)
            and self.contains in reason
        )


def tree_digest(path: Path, *, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """Every entry below ``path`` (symlinks not followed) -> kind, mode and content hash or link target."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in sorted(dirnames + filenames):
            p = here / name
            if p in skip:
                continue
            st = p.lstat()
            rel = str(p.relative_to(path))
            if p.is_symlink():
                out[rel] = f"link {os.readlink(p)}"
            elif p.is_dir():
                out[rel] = f"dir {oct(st.st_mode)}"
            else:
                out[rel] = f"file {oct(st.st_mode)} {st.st_size} {hashlib.sha256(p.read_bytes()).hexdigest()}"
    return out


def make_sentinel(base: Path) -> Path:
    """A small tree that looks like something worth stealing or overwriting (model files included)."""
    s = base / "sentinel"
    (s / "sub" / "deeper").mkdir(parents=True)
    (s / "passwd").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    (s / "sub" / "id_rsa").write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nsentinel\n")
    (s / "config.json").write_bytes(tiny_llama(9)["config.json"])
    (s / "model.safetensors").write_bytes(b"not really weights")
    (s / "sub" / "deeper" / "tokenizer.json").write_bytes(b"{}")
    os.chmod(s / "sub" / "id_rsa", 0o600)
    return s


def deep_json(depth: int) -> bytes:
    return b'{"model_type": "llama", "x": ' + b"[" * depth + b"]" * depth + b"}"


async def create_secret_raw(kube: Kube, namespace: str, name: str, data: dict[str, bytes]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    await kube.c.request("POST", SECRETS.path(namespace), body=body)


async def apply_case(kube: Kube, case: Case, gate: asyncio.Semaphore) -> None:
    async with gate:
        try:
            await kube.apply(case.manifest)
        except ApiError as exc:
            if exc.status not in (400, 422):
                raise
            case.admitted = False
            case.outcome = f"rejected at admission ({exc.status})"


async def node_state(kube: Kube, node: str) -> tuple[dict[str, str], dict[str, str]]:
    labels = await kube.node_labels(node)
    cm = await kube.configmap(node)
    return labels, dict((cm or {}).get("data") or {})


def entry_of(data: dict[str, str], key: str) -> dict[str, Any] | None:
    raw = data.get(key)
    return json.loads(raw) if raw else None


def print_table(cases: list[Case]) -> None:
    width = min(40, max(len(c.name) for c in cases))
    print(f"\n{'case'.ljust(width)}  {'expected'.ljust(18)}  {'first':>6}  outcome")
    for c in cases:
        name = c.name if len(c.name) <= width else c.name[: width - 3] + "..."
        after = "-" if c.settled_after is None else f"{c.settled_after:5.1f}s"
        print(f"{name.ljust(width)}  {c.expect.ljust(18)}  {after:>6}  {c.outcome[:150]}")
    counted = [c for c in cases if c.admitted]
    failed = [c for c in counted if c.expect not in (READY, IGNORED)]
    rejected = len(cases) - len(counted)
    print(f"{len(cases)} cases, {len(counted)} admitted ({len(failed)} expected Failed), {rejected} rejected")


def describe(label: str | None, entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "no label, no entry" if label is None else f"label={label} entry=None"
    if entry.get("status") == "Failed":
        return f"Failed: {entry.get('reason')}"
    return f"label={label} status={entry.get('status')}"


async def wait_for_outcomes(
    kube: Kube, agent: AgentProcess, good: list[Case], corpus: list[Case], started: float
) -> None:
    """Until the good models are Ready and every admitted case matches its expectation, all at one moment."""
    watched = [*good, *(c for c in corpus if c.admitted)]
    deadline = started + DEADLINE_S
    while True:
        labels, data = await node_state(kube, agent.node)
        pending = []
        for case in watched:
            label, entry = labels.get(case.label_key), entry_of(data, case.entry_key)
            case.outcome = describe(label, entry)
            if not case.matches(label, entry):
                pending.append(case)
            elif case.settled_after is None:
                case.settled_after = time.monotonic() - started
        if not pending:
            return
        if time.monotonic() > deadline or not agent.alive():
            print_table([*good, *corpus])
            detail = "\n".join(f"  {c.name}: expected {c.expect} ~ {c.contains!r}; got {c.outcome}" for c in pending)
            raise AssertionError(
                f"{len(pending)} cases not as expected after {DEADLINE_S:.0f}s "
                f"(agent alive: {agent.alive()}):\n{detail}\nagent log:\n{agent.tail(40)}"
            )
        await asyncio.sleep(0.5)


async def warning_reasons(kube: Kube, namespaces: list[str]) -> dict[tuple[str, str], set[str]]:
    """(namespace, object name) -> reasons of the Warning Events on it."""
    out: dict[tuple[str, str], set[str]] = {}
    for ns in namespaces:
        for e in (await kube.c.request("GET", EVENTS.path(ns)))["items"]:
            if e.get("type") == "Warning":
                obj = e.get("involvedObject") or {}
                out.setdefault((ns, str(obj.get("name"))), set()).add(str(e.get("reason")))
    return out


async def everything_visible(kube: Kube, node: str, namespaces: list[str]) -> bytes:
    """The ConfigMap and every Event in ``namespaces``, as the bytes a leak would show up in."""
    cm = await kube.configmap(node)
    events = [await kube.c.request("GET", EVENTS.path(ns)) for ns in namespaces]
    return json.dumps({"configmap": cm, "events": events}).encode()


def assert_no_token(token: str, where: str, blob: bytes) -> None:
    forms = {
        "text": token.encode(),
        "base64": base64.b64encode(token.encode()),
        "base64 with newline": base64.b64encode(token.encode() + b"\n"),
    }
    for form, needle in forms.items():
        assert needle not in blob, f"the token ({form}) appears in {where}"


# ------------------------------------------------------------------------------------------------- corpus


def build_corpus(
    u: str, root: Path, sentinel: Path, good_repo: str, other_repo: str, trap_repo: str, ns: str
) -> list[Case]:
    """The hostile objects. Names start with ``h-`` so they sort after the good model (``g-``)."""
    r = str(root)
    p = f"{r}/h-{u}"  # a harmless destination for cases whose problem is elsewhere
    good_uri = f"hf://{good_repo}"
    cases = [
        # -- destinations (spec.storage.path) ------------------------------------------------------------
        Case(f"h-dotdot-{u}", cbm("", good_uri, f"{r}/../escape-{u}"), "PathRefused", "'..' segments"),
        Case(f"h-dotdot-inner-{u}", cbm("", good_uri, f"{r}/a/../../escape-{u}"), "PathRefused", "'..'"),
        Case(f"h-dot-{u}", cbm("", good_uri, f"{r}/a/./b"), "PathRefused", "'.' or '..' segments"),
        Case(f"h-etc-{u}", cbm("", good_uri, f"/etc/h-{u}"), "PathRefused", "outside the allowed roots"),
        Case(f"h-slash-{u}", cbm("", good_uri, "/"), "PathRefused", "outside the allowed roots"),
        Case(f"h-parent-{u}", cbm("", good_uri, str(root.parent)), "PathRefused", "outside the allowed roots"),
        Case(f"h-sibling-{u}", cbm("", good_uri, f"{r}-sibling/x"), "PathRefused", "outside the allowed roots"),
        Case(f"h-proc-{u}", cbm("", good_uri, f"/proc/self/cwd/h-{u}"), "PathRefused", "symlink"),
        Case(f"h-root-{u}", cbm("", good_uri, r), "PathRefused", "models root itself"),
        Case(f"h-root-slash-{u}", cbm("", good_uri, r + "//"), "PathRefused", "models root itself"),
        Case(f"h-private-{u}", cbm("", good_uri, f"{r}/.model-agent"), "PathRefused", "private area"),
        Case(f"h-staging-{u}", cbm("", good_uri, f"{r}/.model-agent/staging/x"), "PathRefused", "private area"),
        Case(f"h-manifests-{u}", cbm("", good_uri, f"{r}/.model-agent/manifests"), "PathRefused", "private area"),
        Case(f"h-link-out-{u}", cbm("", good_uri, f"{r}/escape/sub"), "PathRefused", "resolves through a symlink"),
        Case(f"h-link-new-{u}", cbm("", good_uri, f"{r}/escape/new-{u}"), "PathRefused", "resolves through a symlink"),
        Case(f"h-link-itself-{u}", cbm("", good_uri, f"{r}/escape"), "PathRefused", "resolves through a symlink"),
        Case(f"h-link-private-{u}", cbm("", good_uri, f"{r}/to-private/x"), "PathRefused", "private area"),
        Case(f"h-link-loop-{u}", cbm("", good_uri, f"{r}/loop-a/x"), "PathRefused", "cannot be resolved"),
        Case(f"h-relative-{u}", cbm("", good_uri, f"models/h-{u}"), "PathRefused", "is not absolute"),
        Case(f"h-empty-path-{u}", cbm("", good_uri, ""), "PathRefused", "is empty"),
        Case(f"h-no-path-{u}", cbm("", good_uri), "PathRefused", "is empty"),
        Case(f"h-nul-{u}", cbm("", good_uri, f"{r}/a\x00b"), "PathRefused", "control characters"),
        Case(f"h-newline-{u}", cbm("", good_uri, f"{r}/a\nb"), "PathRefused", "control characters"),
        Case(f"h-escape-{u}", cbm("", good_uri, f"{r}/a\x1b[2Jb"), "PathRefused", "control characters"),
        Case(f"h-long-name-{u}", cbm("", good_uri, f"{r}/{'n' * 256}"), "PathRefused", "255-byte limit"),
        Case(f"h-long-path-{u}", cbm("", good_uri, r + ("/" + "d" * 200) * 21), "PathRefused", "4096-byte limit"),
        Case(f"h-file-parent-{u}", cbm("", good_uri, f"{r}/a-file/sub"), "PathRefused", "which is not a directory"),
        Case(f"h-file-dest-{u}", cbm("", good_uri, f"{r}/a-file"), "PathRefused", "is not a directory"),
        # A real directory (accepted), but a link inside it leads out, where the repository has a file.
        Case(f"h-trap-{u}", cbm("", f"hf://{trap_repo}", f"{r}/trap"), "UnsafePath", "is a symlink"),
        Case(f"h-conflict-{u}", cbm("", f"hf://{other_repo}", f"{r}/g-{u}"), "PathConflict", f"g-{u}"),
        # -- storage URIs ------------------------------------------------------------------------------------
        Case(f"h-hf-empty-{u}", cbm("", "hf://", p), "InvalidStorageUri", "empty repository id"),
        Case(f"h-hf-deep-{u}", cbm("", "hf://a/b/c/d", p), "InvalidStorageUri", "invalid repository id"),
        Case(f"h-hf-dotdot-{u}", cbm("", "hf://org/..", p), "InvalidStorageUri", "invalid repository id"),
        Case(f"h-hf-query-{u}", cbm("", "hf://acme/x?y=../../z", p), "InvalidStorageUri", "invalid repository id"),
        # A bare trailing "@" is the default branch (issue 19, as OME); an empty segment is refused.
        Case(f"h-hf-rev-empty-{u}", cbm("", "hf://acme/x@a//b", p), "InvalidStorageUri", "invalid revision"),
        Case(f"h-hf-rev-dotdot-{u}", cbm("", "hf://acme/x@..", p), "InvalidStorageUri", "invalid revision"),
        Case(f"h-hf-rev-up-{u}", cbm("", "hf://acme/x@refs/../../etc", p), "InvalidStorageUri", "invalid revision"),
        Case(f"h-hf-ctl-{u}", cbm("", "hf://acme/x\r\nHost: evil", p), "InvalidStorageUri", "control characters"),
        Case(f"h-scheme-{u}", cbm("", "foo://x", p), "InvalidStorageUri", "unknown storage type"),
        Case(f"h-upper-{u}", cbm("", "HF://acme/x", p), "InvalidStorageUri", "unknown storage type"),
        Case(f"h-empty-uri-{u}", cbm("", "", p), "InvalidStorageUri", "unknown storage type"),
        Case(f"h-s3-{u}", cbm("", "s3://", p), "InvalidStorageUri", "no bucket"),
        Case(f"h-s3-slash-{u}", cbm("", "s3:///prefix", p), "InvalidStorageUri", "no bucket"),
        Case(f"h-gs-{u}", cbm("", "gs://", p), "InvalidStorageUri", "no bucket"),
        Case(f"h-az-{u}", cbm("", "az://account", p), "InvalidStorageUri", "needs an account and a container"),
        Case(f"h-oci-{u}", cbm("", "oci://n/x", p), "InvalidStorageUri", "malformed"),
        Case(f"h-pvc-{u}", cbm("", "pvc://", p), IGNORED),
        Case(f"h-pvc-up-{u}", cbm("", "pvc://claim/../../etc", f"{r}/../pvc-{u}"), IGNORED),
        Case(f"h-vendor-{u}", cbm("", "vendor://x", p), "InvalidStorageUri", "malformed"),
        Case(f"h-github-{u}", cbm("", "github://x", p), "InvalidStorageUri", "malformed"),
        Case(f"h-local-empty-{u}", cbm("", "local://", None), "InvalidStorageUri", "has no path"),
        # -- local:// sources: read in place, never written ----------------------------------------------------
        Case(f"h-local-dotdot-{u}", cbm("", "local:///etc/../etc"), "InvalidPath", "'..' segments"),
        Case(f"h-local-relative-{u}", cbm("", "local://etc"), "InvalidPath", "not absolute"),
        Case(f"h-local-private-{u}", cbm("", f"local://{r}/.model-agent/trash"), "InvalidPath", "private area"),
        Case(f"h-local-root-{u}", cbm("", f"local://{r}"), "InvalidPath", "models root itself"),
        Case(f"h-local-missing-{u}", cbm("", f"local:///nonexistent-{u}"), "LocalPathNotFound", "does not exist"),
        Case(f"h-local-etc-{u}", cbm("", "local:///etc"), READY),
        Case(f"h-local-sentinel-{u}", cbm("", f"local://{sentinel}"), READY),
        # -- credentials -----------------------------------------------------------------------------------
        Case(
            f"h-secret-missing-{u}", cbm("", good_uri, p + "-s1", key=f"nope-{u}"), "SecretNotFound", "does not exist"
        ),
        Case(f"h-secret-nokey-{u}", cbm("", good_uri, p + "-s2", key=f"nokey-{u}"), "SecretNotFound", "no data key"),
        Case(
            f"h-secret-datakey-{u}",
            cbm("", good_uri, p + "-s3", key=f"tok-{u}", parameters={"secretKey": "../../etc/passwd"}),
            "SecretNotFound",
            "no data key",
        ),
        Case(f"h-secret-empty-{u}", cbm("", good_uri, p + "-s4", key=f"empty-{u}"), "SecretInvalid", "is empty"),
        Case(f"h-secret-binary-{u}", cbm("", good_uri, p + "-s5", key=f"binary-{u}"), "SecretInvalid", "not text"),
        Case(f"h-secret-dotdot-{u}", cbm("", good_uri, p + "-s6", key=".."), "SecretInvalid", "valid Secret name"),
        Case(f"h-secret-dot-{u}", cbm("", good_uri, p + "-s7", key="."), "SecretInvalid", "valid Secret name"),
        Case(f"h-secret-slash-{u}", cbm("", good_uri, p + "-s8", key="kube-system/x"), "SecretInvalid", "valid Secret"),
        # -- sources ---------------------------------------------------------------------------------------
        Case(f"h-no-repo-{u}", cbm("", f"hf://acme/does-not-exist-{u}", p + "-r1"), "RepositoryNotFound"),
        Case(
            f"h-no-rev-{u}",
            cbm("", f"{good_uri}@no-such-branch", p + "-r2"),
            "RevisionNotFound",
            alternatives=("RepositoryNotFound",),  # olah answers an unknown revision as an unknown repository
        ),
        # -- the CRD schema (these should not get through; if one does, the agent must still cope) ------------
        Case(f"h-policy-{u}", cbm("", good_uri, p + "-c1", downloadPolicy="Sometimes"), "InvalidModel"),
        Case(f"h-params-type-{u}", cbm("", good_uri, p + "-c2", parameters={"token": 1}), "InvalidModel"),
        Case(f"h-selector-type-{u}", cbm("", good_uri, p + "-c3", nodeSelector=["a"]), "InvalidModel"),
        # -- namespaced models ------------------------------------------------------------------------------
        Case(f"h-bm-dotdot-{u}", bm(ns, "", good_uri, f"{r}/../bm-{u}"), "PathRefused", "'..'"),
        Case(f"h-bm-link-{u}", bm(ns, "", good_uri, f"{r}/escape/bm"), "PathRefused", "symlink"),
        Case(f"h-bm-secret-{u}", bm(ns, "", good_uri, p + "-b1", key=f"tok-{u}"), "SecretNotFound", ns),
    ]
    for c in cases:
        c.manifest["metadata"]["name"] = c.name
    return cases


async def test_hostile_corpus_fails_cleanly_while_a_good_model_downloads(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    u = unique
    ns = f"hostile-{u}"
    token = "hf_" + secrets.token_urlsafe(24)
    good_files = tiny_llama(11, padding_bytes=48 * 1024 * 1024)
    good_repo, other_repo = f"acme/good-{u}", f"acme/other-{u}"
    huge_repo, nested_repo, garbage_repo = f"acme/huge-{u}", f"acme/nested-{u}", f"acme/garbage-{u}"
    trap_repo = f"acme/trap-{u}"
    huge_config = b'{"model_type": "llama", "pad": "' + b"x" * (20 * 1024 * 1024) + b'"}'
    bogus_header = (2**62).to_bytes(8, "little") + b"{}"
    await asyncio.gather(
        asyncio.to_thread(create_model_repo, mirrors_root, good_repo, good_files),
        asyncio.to_thread(create_model_repo, mirrors_root, other_repo, tiny_llama(12)),
        asyncio.to_thread(
            create_model_repo, mirrors_root, trap_repo, {**tiny_llama(14), "sub/id_rsa": b"attacker's key\n"}
        ),
        asyncio.to_thread(create_model_repo, mirrors_root, huge_repo, {"config.json": huge_config}),
        asyncio.to_thread(create_model_repo, mirrors_root, nested_repo, {"config.json": deep_json(200_000)}),
        asyncio.to_thread(
            create_model_repo,
            mirrors_root,
            garbage_repo,
            {"config.json": os.urandom(4096), "model.safetensors": bogus_header},
        ),
    )
    await kube.ensure_namespace(ns)
    await kube.create_secret(AGENT_NAMESPACE, f"good-{u}", {"token": token})
    await kube.create_secret(AGENT_NAMESPACE, f"nokey-{u}", {"other": "x"})
    await kube.create_secret(AGENT_NAMESPACE, f"tok-{u}", {"token": token})
    await create_secret_raw(kube, AGENT_NAMESPACE, f"empty-{u}", {"token": b" \n"})
    await create_secret_raw(kube, AGENT_NAMESPACE, f"binary-{u}", {"token": b"\xff\xfe\x00bin"})

    sentinel = make_sentinel(tmp_path)
    agent = await make_agent()
    root = agent.models_root
    # Planted by "someone with a shell on the node": links inside the root leading out, into the private
    # area, in a loop; a file where a directory is expected.
    (root / "escape").symlink_to(sentinel)
    (root / "to-private").symlink_to(root / ".model-agent")
    (root / "loop-a").symlink_to(root / "loop-b")
    (root / "loop-b").symlink_to(root / "loop-a")
    (root / "a-file").write_bytes(b"planted file")
    (root / "trap").mkdir()
    (root / "trap" / "sub").symlink_to(sentinel / "sub")
    planted = tree_digest(root, skip=(root / ".model-agent",))
    outside_before = tree_digest(tmp_path, skip=(root, agent.log_path))
    sentinel_before = tree_digest(sentinel)

    good = [
        Case(f"g-{u}", cbm("", f"hf://{good_repo}", f"{root}/g-{u}", key=f"good-{u}"), READY),
        Case(f"g-huge-config-{u}", cbm("", f"hf://{huge_repo}", f"{root}/huge-{u}"), READY),
        Case(f"g-nested-config-{u}", cbm("", f"hf://{nested_repo}", f"{root}/nested-{u}"), READY),
        Case(f"g-garbage-{u}", cbm("", f"hf://{garbage_repo}", f"{root}/garbage-{u}"), READY),
    ]
    for c in good:
        c.manifest["metadata"]["name"] = c.name
    await kube.apply(good[0].manifest)

    async def downloading() -> bool:
        return (await kube.node_labels(agent.node)).get(good[0].label_key) == "Updating"

    await eventually(downloading, timeout=30, what="the good model downloading")
    corpus = build_corpus(u, root, sentinel, good_repo, other_repo, trap_repo, ns)
    gate = asyncio.Semaphore(16)
    started = time.monotonic()
    await asyncio.gather(*(apply_case(kube, c, gate) for c in [*good[1:], *corpus]))
    await wait_for_outcomes(kube, agent, good, corpus, started)
    elapsed = time.monotonic() - started
    print_table([*good, *corpus])
    print(f"all outcomes reached {elapsed:.1f}s after the corpus was applied")

    admitted = [c for c in corpus if c.admitted]
    failing = [c for c in admitted if c.expect not in (READY, IGNORED)]
    assert len(failing) >= 30, f"only {len(failing)} hostile objects got through admission"
    assert agent.alive() and agent.starts == 1

    # Each failure is also a Warning Event with its own reason on its own object. Events are sent by the agent's
    # recorder after the entry is written (batched, off the reconcile path), so they may trail the outcomes.
    missing: list[str] = []

    async def every_failure_has_its_event() -> bool:
        events = await warning_reasons(kube, ["default", ns])
        missing[:] = [
            f"{c.name}: Warning Events {events.get((c.namespace or 'default', c.name), set())}, expected {c.expect}"
            for c in failing
            if not events.get((c.namespace or "default", c.name), set()) & {c.expect, *c.alternatives}
        ]
        return not missing

    try:
        await eventually(every_failure_has_its_event, timeout=20, what="every failure's Event", interval=0.5)
    except AssertionError:
        raise AssertionError("\n".join(missing)) from None

    # The good model is complete and intact; planted things in the root are as they were.
    for rel, data in good_files.items():
        assert (root / f"g-{u}" / rel).read_bytes() == data, rel
    assert tree_digest(root, skip=(root / ".model-agent",)).items() >= planted.items()
    assert (root / "a-file").read_bytes() == b"planted file"
    # Nothing outside the models root changed, except the agent's own log and HF_HOME.
    assert tree_digest(sentinel) == sentinel_before
    outside_after = tree_digest(tmp_path, skip=(root, agent.log_path))
    changed = {k for k in outside_before.keys() | outside_after.keys() if outside_before.get(k) != outside_after.get(k)}
    assert not changed, {k: (outside_before.get(k), outside_after.get(k)) for k in sorted(changed)}
    for stray in (Path(f"/etc/h-{u}"), root.parent / f"escape-{u}", Path(f"{root}-sibling"), Path(f"/nonexistent-{u}")):
        assert not stray.exists(), stray
    assert not Path(os.getcwd(), f"h-{u}").exists()

    # A read-only local model over the sentinel: removing it leaves the sentinel alone.
    local = next(c for c in corpus if c.name.startswith("h-local-sentinel"))
    await kube.delete_model(CBM, local.name)

    async def removed() -> bool:
        return local.label_key not in await kube.node_labels(agent.node)

    await eventually(removed, timeout=30, what="the local model removed")
    assert tree_digest(sentinel) == sentinel_before

    # The Secret-backed good model: its token is nowhere.
    visible = await everything_visible(kube, agent.node, ["default", ns, AGENT_NAMESPACE])
    assert_no_token(token, "the ConfigMap or the Events", visible)
    assert agent.alive() and agent.starts == 1
    await asyncio.to_thread(agent.stop)  # flush the log
    assert_no_token(token, "the agent log", agent.log_path.read_bytes())

    for c in [*good, *corpus]:
        if c.admitted:
            await kube.delete_model(c.kind, c.name, c.namespace or None)


async def test_tokens_never_leak(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    u = unique
    ns = f"tokens-{u}"
    secret_token = "hf_" + secrets.token_urlsafe(24)
    bm_token = "hf_" + secrets.token_urlsafe(24)
    plain_token = "hf_" + secrets.token_urlsafe(24)
    repo = f"acme/tok-{u}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, tiny_llama(13))
    await kube.ensure_namespace(ns)
    # As `kubectl create secret --from-file` would store it: with a trailing newline.
    await create_secret_raw(kube, AGENT_NAMESPACE, f"hf-{u}", {"token": secret_token.encode() + b"\n"})
    await kube.create_secret(ns, "hf", {"hf-token": bm_token})
    agent = await make_agent()
    root = agent.models_root
    models = {
        "secret": cbm(f"tok-secret-{u}", f"hf://{repo}", f"{root}/secret", key=f"hf-{u}"),
        "namespaced": bm(
            ns, f"tok-bm-{u}", f"hf://{repo}", f"{root}/bm", key="hf", parameters={"secretKey": "hf-token"}
        ),
        "plain": cbm(f"tok-plain-{u}", f"hf://{repo}", f"{root}/plain", parameters={"token": plain_token}),
    }
    for body in models.values():
        await kube.apply(body)

    async def all_ready() -> bool:
        labels = await kube.node_labels(agent.node)
        return all(
            labels.get(node_label_key(b["kind"], b["metadata"].get("namespace", ""), b["metadata"]["name"])) == READY
            for b in models.values()
        )

    await eventually(all_ready, timeout=60, what="the three token-backed models Ready")

    async def plaintext_warned() -> bool:
        events = await kube.events_for(f"tok-plain-{u}")
        return any(e["reason"] == "PlaintextToken" and e["type"] == "Warning" for e in events)

    await eventually(plaintext_warned, timeout=15, what="a PlaintextToken Warning Event")
    secret_events = await kube.events_for(f"tok-secret-{u}")
    assert not any(e["reason"] == "PlaintextToken" for e in secret_events)

    visible = await everything_visible(kube, agent.node, ["default", ns, AGENT_NAMESPACE])
    assert agent.alive() and agent.starts == 1
    await asyncio.to_thread(agent.stop)  # flush the log
    log = agent.log_path.read_bytes()
    assert b"PlaintextToken" in log or b"plain-text token" in log  # the log is really the agent's
    for token in (secret_token, bm_token, plain_token):
        assert_no_token(token, "the ConfigMap or the Events", visible)
        assert_no_token(token, "the agent log", log)
    print(f"agent log: {len(log)} bytes, no token in any form")
    for body in models.values():
        await kube.delete_model(body["kind"], body["metadata"]["name"], body["metadata"].get("namespace"))


async def test_a_253_character_name_keeps_its_entry_and_trips_nothing(
    kube: Kube, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=("--resync-interval", "2"))
    name = f"h-long-{unique}-" + "x" * 253
    name = name[:253]
    case = Case(name, cbm(name, "foo://long-name", f"{agent.models_root}/long"), "InvalidStorageUri", "unknown")
    await kube.apply(case.manifest)

    async def failed() -> bool:
        labels, data = await node_state(kube, agent.node)
        return case.matches(labels.get(case.label_key), entry_of(data, case.entry_key))

    await eventually(failed, timeout=30, what="the long-named model Failed")
    await always(failed, duration=8, what="the entry of a live long-named model stays through four resyncs")
    assert agent.alive() and agent.starts == 1
    await asyncio.to_thread(agent.stop)  # flush the log
    removals = [line for line in agent.log_text().splitlines() if '"event": "model removed"' in line]
    await kube.delete_model(CBM, name)
    assert not removals, f"{len(removals)} removals of a model nobody deleted, e.g. {removals[0][:200]}"
