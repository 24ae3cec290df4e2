"""Shared fixtures: one real control plane, one olah mirror, one fake-gcs-server and one Azurite per session.

End-to-end tests never skip for a missing component: if the control plane binaries are not cached they
are built (a cold build takes ~9 minutes on 2 cores), and a failure to build or start fails the tests; the
same holds for the GCS and Azure emulators (``python -m testbed build --with-emulators`` caches them).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from model_agent.kube.client import KubeClient
from testbed.servers.azurite import AzuriteServer
from testbed.servers.controlplane import ControlPlane
from testbed.servers.fakegcs import FakeGcsServer
from testbed.servers.olah import OlahServer
from tests.support.kube import Kube

_ids = itertools.count(1)

# Property suites: each test fixes its own example budget (``max_examples``) and ``deadline=None``; the
# profile decides where examples come from. "ci" (the default, what `make test` runs) derives them from
# each test's name, so every run checks the same examples and a failure reproduces exactly; "explore"
# (HYPOTHESIS_PROFILE=explore) draws fresh random ones and keeps failures in the example database.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane"))
    plane.up(["n1", "n2"], echo=print)
    try:
        yield plane
    finally:
        plane.down()


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[Kube]:
    client = await KubeClient.connect(kubeconfig)
    try:
        yield Kube(client)
    finally:
        await client.close()


@pytest.fixture(scope="session")
def mirrors_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-mirrors")


@pytest.fixture(scope="session")
def olah(mirrors_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OlahServer]:
    with OlahServer(mirrors_root, tmp_path_factory.mktemp("olah-state")) as server:
        yield server


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcsServer]:
    """A real GCS API (fake-gcs-server) on loopback; ``fake_gcs.endpoint`` is the ``endpoint`` parameter."""
    with FakeGcsServer(tmp_path_factory.mktemp("fake-gcs")) as server:
        yield server


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """A real Azure Blob API (Azurite) on loopback; ``azurite.endpoint`` is the ``endpoint`` parameter."""
    with AzuriteServer(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture
def unique() -> str:
    """A short suffix unique within the session, for node and model names."""
    return f"{os.getpid() % 1000}-{next(_ids)}"
