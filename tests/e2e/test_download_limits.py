"""Download deadlines end to end: a fetch that stops moving bytes fails with a reason and frees its worker.

The per-read timeout of the transfer engine never fires against a body that trickles just inside it, or a
mirror that holds a request open; ``--download-min-rate`` over ``--download-min-rate-window`` does. Here the
project's fault proxy holds every file request of one model at the Hugging Face mirror (olah): the model goes
``Failed: DownloadTooSlow`` within the window, the agent stays up, another model fetched at the same time is
``Ready``, and once the mirror answers again the failed model is fetched on retry.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from testbed.models import tiny_llama
from testbed.proxies.faultproxy import FaultProxy, Rule, stall
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.e2e.test_reconcile_safety import wait_failed, wait_ready
from tests.support.kube import Kube, cbm

pytestmark = pytest.mark.e2e


async def test_a_stalled_download_fails_too_slow_and_frees_its_worker(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    async with FaultProxy(olah.endpoint) as hub:
        agent = await make_agent(
            args=(
                "--num-download-worker",
                "1",  # one worker: the stuck download must give it back for the other model to be fetched
                "--download-min-rate",
                "4096",
                "--download-min-rate-window",
                "3",
            ),
            env={"HF_ENDPOINT": hub.url},
        )
        stuck, fine = f"stuck-{unique}", f"fine-{unique}"
        for name, seed in ((stuck, 61), (fine, 62)):
            await asyncio.to_thread(create_model_repo, mirrors_root, f"acme/{name}", tiny_llama(seed))
        # Held, then dropped: a mirror that accepts the request and sends nothing. The hold is shorter than the
        # test so the thread of a cancelled small-file request (threads cannot be interrupted) ends on its own.
        held = hub.add_rule(Rule(rf"/acme/{stuck}/resolve/", stall(15.0, then="drop")))
        await kube.apply(cbm(stuck, f"hf://acme/{stuck}", str(agent.models_root / stuck)))
        await wait_failed(kube, agent, stuck, "DownloadTooSlow", timeout=30)
        held.remove()
        await kube.apply(cbm(fine, f"hf://acme/{fine}", str(agent.models_root / fine)))
        await wait_ready(kube, agent, fine, timeout=30)
        assert agent.alive()
        await wait_ready(kube, agent, stuck, timeout=60)  # the retry (with backoff) fetches it
        assert "--download-min-rate" in agent.log_text()
        await asyncio.to_thread(agent.stop, 30.0)  # while the mirror is still there
