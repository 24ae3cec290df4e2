"""Fixtures for agent end-to-end tests: a fresh Node and models root per test, the agent as a subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from model_agent.kube.client import ApiError
from model_agent.kube.resources import BASEMODELS, CLUSTERBASEMODELS
from testbed.agent_process import AgentProcess
from testbed.proxies.faultproxy import FaultProxy
from testbed.servers.olah import OlahServer
from tests.support.kube import Kube

AgentFactory = Callable[..., Awaitable[AgentProcess]]


@pytest.fixture
async def make_agent(
    kubeconfig: Path, kube: Kube, olah: OlahServer, tmp_path: Path, unique: str
) -> AsyncIterator[AgentFactory]:
    """``await make_agent(labels=..., args=..., env=...)``: create a Node, start an agent for it, wait for /readyz."""
    agents: list[AgentProcess] = []

    async def factory(
        *,
        node: str | None = None,
        labels: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        models_root: Path | None = None,
        via: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> AgentProcess:
        name = node or f"node-{unique}-{len(agents)}"
        await kube.create_node(name, labels)
        agent = AgentProcess(
            kubeconfig=via or kubeconfig,
            node=name,
            models_root=models_root or tmp_path / f"models-{name}",
            log_path=tmp_path / f"agent-{name}.log",
            hf_endpoint=olah.endpoint,
            args=("--resync-interval", "30", "--delete-settle", "0.5", "--confirm-debounce", "0.2", *args),
            env=env,
        )
        agents.append(agent)
        agent.start()
        await asyncio.to_thread(agent.wait_ready)
        return agent

    try:
        yield factory
    finally:
        for agent in agents:
            if agent.alive():
                agent.stop()


@pytest.fixture(autouse=True)
async def no_leftover_models(kube: Kube) -> AsyncIterator[None]:
    """Every e2e test shares one API server: whatever models a test leaves (a failed test skips its own
    clean-up) are deleted after it, so they cannot leak into the next test's node."""
    yield
    for resource in (CLUSTERBASEMODELS, BASEMODELS):
        try:
            items = (await kube.c.request("GET", resource.path()))["items"]
        except ApiError:
            continue  # the kind may be gone (a test deletes the CRD)
        for item in items:
            meta = item["metadata"]
            await kube.delete_model(resource.kind, meta["name"], meta.get("namespace"))


@pytest.fixture
def proxy(kubeconfig: Path, tmp_path: Path) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the real API server; ``proxy.kubeconfig`` points at it."""
    with FaultProxy.from_kubeconfig(kubeconfig) as fp:
        fp.kubeconfig = fp.write_kubeconfig(tmp_path / "proxy-kubeconfig")  # type: ignore[attr-defined]
        yield fp
