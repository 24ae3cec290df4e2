"""The agent image built from Dockerfile (``make image``): what is in it, what is not, and its size.

Reads the OCI archive the test bed caches for this source tree (``python -m testbed image`` or
``python -m testbed build --with-node``; CI builds it before the tests). Without that archive the test is
skipped on a developer machine and fails in CI, where a missing image means the build step broke.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed import image
from testbed.servers.controlplane import repo_root

# Measured: 813 MiB uncompressed (170 MiB as the gzip OCI archive): the base (Debian minbase + Python
# 3.11) is 168 MiB, the virtualenv 645 MiB, of which the OCI SDK (`oci`, for oci:// models) is 427 MiB.
MAX_IMAGE_MIB = 900


@pytest.fixture(scope="module")
def built() -> tuple[dict[str, object], set[str], int]:
    context = Path(os.environ.get("TESTBED_IMAGE_CONTEXT") or repo_root())
    archive = image.image_dir() / f"model-agent-{image.agent_key(context)}.oci.tar"
    if not archive.is_file():
        message = f"no agent image for this tree at {archive}: run `python -m testbed image`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    _, config, layers = image.read_manifest(archive)
    return config, image.file_list(layers), sum(len(layer) for layer in layers)


def test_runs_the_agent_unprivileged_by_default(built: tuple[dict[str, object], set[str], int]) -> None:
    config, files, _ = built
    run = config["config"]
    assert isinstance(run, dict)
    assert run["Entrypoint"] == ["model-agent", "run"]
    assert run["User"] == "65532:65532"
    assert "/opt/model-agent/bin/model-agent" in files


def test_has_no_compiler_no_installer_and_no_test_bed(built: tuple[dict[str, object], set[str], int]) -> None:
    _, files, _ = built
    names = {"gcc", "cc", "g++", "c++", "clang", "ld", "as", "make", "cc1"}
    compilers = {f for f in files if "/bin/" in f and f.rsplit("/", 1)[-1].split("-")[-1] in names}
    assert not compilers, compilers
    installers = {
        f
        for f in files
        if f.endswith(("/bin/pip", "/bin/pip3")) or "/site-packages/pip/" in f or "/dist-packages/pip/" in f
    }
    assert not installers, sorted(installers)[:5]
    assert not any("/site-packages/setuptools/" in f for f in files)
    assert not any("/site-packages/testbed/" in f or "/site-packages/tests/" in f for f in files)
    # Bytecode was compiled at build time: the root file system is read-only at run time.
    assert any(f.endswith(".pyc") and "/site-packages/model_agent/" in f for f in files)


def test_size_is_bounded(built: tuple[dict[str, object], set[str], int]) -> None:
    _, _, size = built
    print(f"agent image: {size >> 20} MiB uncompressed")
    assert size < MAX_IMAGE_MIB << 20
