"""The local control plane: a real kube-apiserver + etcd, its CRDs, a CRD server-side apply, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import CLUSTERBASEMODELS, CRDS, NODES
from testbed.cli import app
from testbed.servers import controlplane as cp
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e


async def test_version_nodes_and_crds(control_plane: cp.ControlPlane, kube: Kube) -> None:
    version = await kube.c.request("GET", "/version")
    assert version["major"] == "1" and version["minor"] == "36", version
    assert version["gitVersion"] == cp.KUBERNETES_VERSION
    names = {n["metadata"]["name"] for n in (await kube.c.request("GET", NODES.path()))["items"]}
    assert {"n1", "n2"} <= names
    for crd in ("basemodels.ome.io", "clusterbasemodels.ome.io"):
        obj = await kube.c.request("GET", CRDS.path(name=crd))
        conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
        assert conditions.get("Established") == "True", conditions


async def test_crd_server_side_apply_ends_the_watch_and_relist_succeeds(kube: Kube, unique: str) -> None:
    name = f"ssa-{unique}"

    async def listing() -> dict[str, Any] | None:
        try:
            return await kube.c.request("GET", CLUSTERBASEMODELS.path())
        except ApiError as exc:
            assert exc.status == 429, exc  # a fresh CRD's storage answers 429 until its cache is ready
            return None

    first = await eventually(listing, timeout=60, what="a first LIST")
    assert first is not None  # eventually returns only a truthy value
    rv = first["metadata"]["resourceVersion"]
    events: list[str] = []
    established = asyncio.Event()

    async def watch() -> str:
        async for event in kube.c.watch_lines(
            CLUSTERBASEMODELS.path(),
            query={"watch": "true", "resourceVersion": rv, "timeoutSeconds": 120},
            read_timeout=150,
        ):
            events.append(str(event.get("type")))
            if (event.get("object") or {}).get("metadata", {}).get("name") == name:
                established.set()
        return "ended"

    watcher = asyncio.create_task(watch())
    # The object is created after the watch starts, so its ADDED event proves the watch is established
    # before the CRD changes (otherwise the watch request itself could meet the re-initialising storage).
    created = await kube.apply(cbm(name, "hf://acme/tiny", "/mnt/models/x"))
    uid = created["metadata"]["uid"]
    await asyncio.wait_for(established.wait(), 60)
    original = next(d for d in cp.crd_documents() if d["metadata"]["name"] == "clusterbasemodels.ome.io")
    changed = copy.deepcopy(original)
    changed["spec"]["versions"][0]["additionalPrinterColumns"].append(
        {"name": "Extra", "type": "string", "jsonPath": ".spec.vendor"}
    )
    try:
        await cp.apply_crd(kube.c, changed)
        assert await asyncio.wait_for(watcher, 150) == "ended"
        assert "DELETED" not in events

        # The relist a reflector would do now: it succeeds (after 429s while the new watch cache initialises)
        # and still holds the object with its UID.
        async def relist() -> dict[str, str] | None:
            try:
                items = (await kube.c.request("GET", CLUSTERBASEMODELS.path()))["items"]
            except ApiError as exc:
                assert exc.status in (429, 503), exc
                return None
            return {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}

        found = await eventually(relist, timeout=120, what="a successful relist after the CRD apply")
        assert found is not None and found[name] == uid
    finally:
        watcher.cancel()
        await cp.apply_crd(kube.c, original)
    await kube.delete_model("ClusterBaseModel", name)
    for _ in range(200):
        if await kube.model_gone("ClusterBaseModel", name):
            break
        await asyncio.sleep(0.05)
    assert await kube.model_gone("ClusterBaseModel", name)


def test_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = CliRunner().invoke(app, ["up", "--state-dir", str(tmp_path / "s"), "--port", str(port)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("error: port") and "--port" in lines[-1]


def test_dev_down_with_nothing_running_exits_0(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["down", "--state-dir", str(tmp_path / "empty")])
    assert result.exit_code == 0, result.output
    assert "nothing running" in result.output


def test_missing_go_toolchain_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    result = CliRunner().invoke(app, ["build"])
    assert result.exit_code == 2
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: the Go toolchain") and "install" in line


async def test_stale_state_dir_from_a_killed_run_is_recovered(tmp_path: Path) -> None:
    plane = cp.ControlPlane(tmp_path / "stale")
    state = await asyncio.to_thread(plane.up, ["s1"])
    os.kill(state.apiserver_pid, signal.SIGKILL)
    os.kill(state.etcd_pid, signal.SIGKILL)
    for pid in (state.apiserver_pid, state.etcd_pid):  # SIGKILL is asynchronous: wait until both are gone
        for _ in range(200):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes():
                break
            await asyncio.sleep(0.05)
    messages: list[str] = []
    try:
        await asyncio.to_thread(lambda: plane.up(["s1"], echo=messages.append))
        assert any("killed run" in m for m in messages), messages
        client = await KubeClient.connect(plane.kubeconfig)
        try:
            node = await client.request("GET", NODES.path(name="s1"))
            assert node["metadata"]["name"] == "s1"
        finally:
            await client.close()
        # Running already: a second up says so in one line.
        with pytest.raises(cp.ControlPlaneError, match="already running"):
            plane.up(["s1"])
    finally:
        assert plane.down() is True
    assert plane.down() is False
