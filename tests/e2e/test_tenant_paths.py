"""Tenants' directories, end to end (real API server, real olah mirror, the agent as a subprocess).

a namespaced BaseModel is a tenant's, and tenants do not trust each other.

* One owner per directory tree: a tenant model at a parent, a child or the same path as another model's
  directory (the same URI with its own ``endpoint`` is another owner) is ``Failed: PathConflict`` naming
  the rule and the model that keeps the directory; the victim's label, entry and bytes never change, also
  not when the tenant's models are deleted (nothing of the victim moves into the trash).
* A tenant's ``local://`` path must lie inside the allowed roots (``/``, ``/etc`` are refused) and never
  in another model's directory.
* A trashed copy goes back only to its owner: a tenant naming the same URI and path as a trashed
  ClusterBaseModel fetches (or fails); the admin's copy stays in the trash.

The agent runs with ``--tenant-address-allow 127.0.0.0/8`` so tenant models may reach the loopback mirror
(the egress rules of item 1 are not what these tests are about).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, bm, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

BM = "BaseModel"
CBM = "ClusterBaseModel"
VICTIM_NS = "team-a"
EVIL_NS = "team-evil"
AGENT_ARGS = ("--tenant-address-allow", "127.0.0.0/8")
# Deleting the attackers' models is most of this node's models at once: not what the breaker is tested on here.
NO_BREAKER = ("--delete-breaker-min", "1000")
RULE = "one owner per directory tree"


async def state(kube: Kube, agent: AgentProcess, kind: str, namespace: str, name: str) -> tuple[Any, Any]:
    """(label, entry) of one model on the agent's node."""
    labels = await kube.node_labels(agent.node)
    entry = await kube.entry(agent.node, configmap_key(kind, namespace, name))
    return labels.get(node_label_key(kind, namespace, name)), entry


def tree(dest: Path) -> dict[str, bytes] | None:
    """Every file below ``dest`` (relative path -> bytes); None when ``dest`` does not exist."""
    if not dest.exists():
        return None
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


async def wait_ready(kube: Kube, agent: AgentProcess, kind: str, namespace: str, name: str) -> None:
    async def ready() -> bool:
        label, entry = await state(kube, agent, kind, namespace, name)
        return label == "Ready" and (entry or {}).get("status") == "Ready"

    await eventually(ready, timeout=60, what=f"{kind}/{namespace}/{name} Ready")


async def wait_failed(kube: Kube, agent: AgentProcess, namespace: str, name: str, reason: str) -> str:
    """Wait until a BaseModel is Failed with ``reason``; return the whole reason text."""

    async def failed() -> str | None:
        label, entry = await state(kube, agent, BM, namespace, name)
        text = str((entry or {}).get("reason") or "")
        if label == "Failed" and (entry or {}).get("status") == "Failed" and text.startswith(reason + ": "):
            return text
        return None

    found = await eventually(failed, timeout=60, what=f"{namespace}/{name} Failed: {reason}")
    assert found is not None
    return found


async def test_a_tenant_cannot_take_a_parent_child_or_the_same_directory(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=(*AGENT_ARGS, *NO_BREAKER))
    for ns in (VICTIM_NS, EVIL_NS):
        await kube.ensure_namespace(ns)
    root = agent.models_root
    victim_repo, evil_repo = f"acme/victim-{unique}", f"acme/evil-{unique}"
    victim_files = tiny_llama(1)
    await asyncio.to_thread(create_model_repo, mirrors_root, victim_repo, victim_files)
    await asyncio.to_thread(create_model_repo, mirrors_root, evil_repo, tiny_llama(2))
    victim, dest = f"victim-{unique}", root / f"org-{unique}" / "llama"
    await kube.apply(bm(VICTIM_NS, victim, f"hf://{victim_repo}", str(dest)))
    await wait_ready(kube, agent, BM, VICTIM_NS, victim)
    before = (await state(kube, agent, BM, VICTIM_NS, victim), tree(dest))
    assert before[1] is not None and {k: before[1].get(k) for k in victim_files} == victim_files

    victim_key = f"BaseModel/{VICTIM_NS}/{victim}"
    attacks = {
        # name -> (manifest, reason, what the reason must say)
        f"parent-{unique}": (
            bm(EVIL_NS, f"parent-{unique}", f"hf://{evil_repo}", str(dest.parent)),
            "PathConflict",
            "contains",
        ),
        f"child-{unique}": (
            bm(EVIL_NS, f"child-{unique}", f"hf://{evil_repo}", str(dest / "sub")),
            "PathConflict",
            "is inside",
        ),
        f"same-{unique}": (
            bm(EVIL_NS, f"same-{unique}", f"hf://{victim_repo}", str(dest) + "/"),
            "PathConflict",
            "is the directory that",
        ),
        f"endpoint-{unique}": (  # the victim's own namespace, URI and path, but the tenant's endpoint
            bm(
                VICTIM_NS,
                f"endpoint-{unique}",
                f"hf://{victim_repo}",
                str(dest),
                parameters={"endpoint": "http://127.0.0.1:9/"},
            ),
            "PathConflict",
            "is the directory that",
        ),
        f"peek-{unique}": (  # reading the victim's directory in place
            bm(EVIL_NS, f"peek-{unique}", f"local://{dest}"),
            "PathConflict",
            "is the directory that",
        ),
        f"slash-{unique}": (bm(EVIL_NS, f"slash-{unique}", "local:///"), "InvalidPath", "outside the allowed roots"),
        f"etc-{unique}": (bm(EVIL_NS, f"etc-{unique}", "local:///etc"), "InvalidPath", "outside the allowed roots"),
        f"kubelet-{unique}": (
            bm(EVIL_NS, f"kubelet-{unique}", "local:///etc", "/var/lib/kubelet"),
            "InvalidPath",
            "outside the allowed roots",
        ),
    }
    for manifest, _, _ in attacks.values():
        await kube.apply(manifest)
    for name, (manifest, reason, says) in attacks.items():
        text = await wait_failed(kube, agent, manifest["metadata"]["namespace"], name, reason)
        assert says in text, text
        if reason == "PathConflict":
            assert RULE in text and victim_key in text, text
    assert (await state(kube, agent, BM, VICTIM_NS, victim), tree(dest)) == before
    assert not (dest / "sub").exists()

    # Deleting the tenants' models moves nothing of the victim's into the trash.
    for name, (manifest, _, _) in attacks.items():
        await kube.delete_model(BM, name, manifest["metadata"]["namespace"])

    async def tenants_gone() -> bool:
        for name, (manifest, _, _) in attacks.items():
            if await state(kube, agent, BM, manifest["metadata"]["namespace"], name) != (None, None):
                return False
        return True

    await eventually(tenants_gone, timeout=60, what="the tenants' labels and entries removed")
    assert (await state(kube, agent, BM, VICTIM_NS, victim), tree(dest)) == before
    assert not list((root / ".model-agent" / "trash").iterdir())
    assert agent.alive()
    await kube.delete_model(BM, victim, VICTIM_NS)


async def test_a_tenant_does_not_get_a_trashed_cluster_model(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=AGENT_ARGS)
    await kube.ensure_namespace(EVIL_NS)
    repo = f"acme/shared-{unique}"
    files = tiny_llama(3)
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    name, dest = f"admin-{unique}", agent.models_root / f"shared-{unique}"
    await kube.apply(cbm(name, f"hf://{repo}", str(dest)))
    await wait_ready(kube, agent, CBM, "", name)
    await kube.delete_model(CBM, name)
    trash = agent.models_root / ".model-agent" / "trash"

    async def trashed() -> list[Path]:
        gone = await state(kube, agent, CBM, "", name) == (None, None)
        entries = list(trash.iterdir()) if trash.is_dir() else []
        return entries if gone and len(entries) == 1 and not dest.exists() else []

    entry = (await eventually(trashed, timeout=30, what="the admin's copy in the trash"))[0]
    admin_bytes = tree(entry / "data")
    assert admin_bytes is not None and {k: admin_bytes.get(k) for k in files} == files

    requests = olah.request_count(path_contains=repo)
    tenant = f"copycat-{unique}"
    await kube.apply(bm(EVIL_NS, tenant, f"hf://{repo}", str(dest)))

    async def settled() -> str | None:
        label, entry_json = await state(kube, agent, BM, EVIL_NS, tenant)
        status = (entry_json or {}).get("status")
        return status if label == status and status in ("Ready", "Failed") else None

    outcome = await eventually(settled, timeout=60, what="the tenant's model Ready (fetched) or Failed")
    assert agent.metric("model_agent_restored_total") == 0
    assert tree(entry / "data") == admin_bytes  # the admin's copy is still in the trash, untouched
    assert list(trash.iterdir()) == [entry]
    if outcome == "Ready":  # fetched from the source, not renamed out of the trash
        assert olah.request_count(path_contains=repo) > requests
        fetched = tree(dest) or {}
        assert {k: fetched.get(k) for k in files} == files
    await kube.delete_model(BM, tenant, EVIL_NS)


async def test_a_tenant_on_another_node_of_a_shared_root_neither_adopts_nor_adds_to_a_trusted_directory(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """Two nodes share one models root. A ClusterBaseModel selects node B only; a tenant's BaseModels select node
    A only, where the ClusterBaseModel is not live. (a) One names the same source and directory: it must not take
    the platform's copy without fetching with its own credentials. (b) One names its own source at that directory:
    nothing may be added to it. Both are refused (the directory is the ClusterBaseModel's on the shared root);
    the trusted directory and its Ready state stay as they were."""
    shared = tmp_path / "shared-models"
    trusted_node, tenant_node = f"node-{unique}-b", f"node-{unique}-a"
    b = await make_agent(node=trusted_node, models_root=shared, args=(*AGENT_ARGS, *NO_BREAKER))
    a = await make_agent(node=tenant_node, models_root=shared, args=(*AGENT_ARGS, *NO_BREAKER))
    await kube.ensure_namespace(EVIL_NS)
    repo, evil_repo = f"acme/gated-{unique}", f"acme/extra-{unique}"
    files = tiny_llama(5)
    evil_files = {"chat_template.jinja": b"{{ exfiltrate() }}", "extra.safetensors": b"\0" * 64}
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    await asyncio.to_thread(create_model_repo, mirrors_root, evil_repo, evil_files)
    dest = shared / f"org-{unique}" / "llama"
    name = f"trusted-{unique}"
    await kube.apply(cbm(name, f"hf://{repo}", str(dest), nodeSelector={"kubernetes.io/hostname": trusted_node}))
    await wait_ready(kube, b, CBM, "", name)
    before = tree(dest)
    assert before is not None and {k: before.get(k) for k in files} == files
    on_a = {"kubernetes.io/hostname": tenant_node}
    cbm_key = f"ClusterBaseModel//{name}"
    attempts = {  # one at a time: each must be refused for the trusted model's sake, not for the other's
        f"steal-{unique}": f"hf://{repo}",
        f"poison-{unique}": f"hf://{evil_repo}",
    }
    for tenant, uri in attempts.items():
        await kube.apply(bm(EVIL_NS, tenant, uri, str(dest), nodeSelector=on_a))

        async def settled(tenant: str = tenant) -> tuple[Any, Any] | None:
            label, entry = await state(kube, a, BM, EVIL_NS, tenant)
            done = label in ("Ready", "Failed") and (entry or {}).get("status") == label
            return (label, entry) if done else None

        found = await eventually(settled, timeout=60, what=f"{tenant} settled")
        assert found is not None
        label, entry = found
        assert label == "Failed" and str(entry.get("reason", "")).startswith("PathConflict: "), (tenant, entry)
        assert cbm_key in entry["reason"], entry
        assert tree(dest) == before  # nothing added, nothing replaced
        await kube.delete_model(BM, tenant, EVIL_NS)

        async def gone(tenant: str = tenant) -> bool:
            return await state(kube, a, BM, EVIL_NS, tenant) == (None, None)

        await eventually(gone, timeout=60, what=f"{tenant}'s label and entry removed")
    assert tree(dest) == before
    assert (await state(kube, b, CBM, "", name))[0] == "Ready"
    await kube.delete_model(CBM, name)
