"""End-to-end: huggingface_hub against a real olah mirror serving git repositories made by devenv.olah.

One olah serves the whole module (start-up costs ~2 s of CPU); every test uses its own repository id,
so tests do not depend on each other. Olah reads the git repositories on every request, so a repository
created or changed while it runs is served at once - no waiting is needed anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError
from huggingface_hub.hf_api import RepoFile
from safetensors.numpy import save

from testbed.proxies.countingproxy import ServedRequest
from testbed.servers.olah import OlahServer, add_commit, create_model_repo, repo_dir

pytestmark = pytest.mark.e2e


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tiny_model(seed: int = 0) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    weights = save(
        {
            "embed.weight": rng.standard_normal((64, 32), dtype=np.float32),
            "head.bias": np.arange(16, dtype=np.int64),
        },
        metadata={"format": "np"},
    )
    config = json.dumps({"model_type": "tiny", "hidden_size": 32, "seed": seed}).encode()
    return {"config.json": config, "model.safetensors": weights}


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mirrors")


@pytest.fixture(scope="module")
def mirror(mirrors: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OlahServer]:
    with OlahServer(mirrors, tmp_path_factory.mktemp("olah-state")) as server:
        yield server
    assert not server.running


@pytest.fixture
def api(mirror: OlahServer) -> HfApi:
    return HfApi(endpoint=mirror.endpoint, token=False)


def tree_files(api: HfApi, repo_id: str, revision: str) -> dict[str, RepoFile]:
    entries = api.list_repo_tree(repo_id, recursive=True, revision=revision)
    return {e.path: e for e in entries if isinstance(e, RepoFile)}


def test_snapshot_download_lists_and_serves_identical_bytes(
    mirror: OlahServer, mirrors: Path, api: HfApi, tmp_path: Path
) -> None:
    files = tiny_model()
    commit = create_model_repo(mirrors, "acme/tiny", files)
    attrs = (repo_dir(mirrors, "acme/tiny") / ".gitattributes").read_bytes()
    weights = files["model.safetensors"]

    info = api.model_info("acme/tiny", revision="main")
    assert info.sha == commit
    assert {s.rfilename for s in info.siblings or []} == {
        ".gitattributes",
        "config.json",
        "model.safetensors",
    }
    assert api.model_info("acme/tiny").sha == commit  # no revision: the proxy's default-revision shim
    assert api.model_info("acme/tiny", revision=commit).sha == commit

    tree = tree_files(api, "acme/tiny", "main")
    assert set(tree) == {".gitattributes", "config.json", "model.safetensors"}
    assert tree["config.json"].size == len(files["config.json"])
    assert tree["config.json"].blob_id == git_blob_sha(files["config.json"])
    assert tree["config.json"].lfs is None
    lfs = tree["model.safetensors"].lfs
    assert lfs is not None
    assert (lfs.sha256, lfs.size) == (sha256(weights), len(weights))
    assert tree["model.safetensors"].size == len(weights)
    assert tree["model.safetensors"].blob_id == git_blob_sha(
        repo_dir(mirrors, "acme/tiny").joinpath("model.safetensors").read_bytes()  # the pointer's blob
    )

    meta = get_hf_file_metadata(hf_hub_url("acme/tiny", "model.safetensors", endpoint=mirror.endpoint))
    assert (meta.commit_hash, meta.etag, meta.size) == (commit, sha256(weights), len(weights))
    assert meta.xet_file_data is None  # plain HTTP downloads: no HF_HUB_DISABLE_XET needed
    meta = get_hf_file_metadata(hf_hub_url("acme/tiny", "config.json", endpoint=mirror.endpoint))
    config = files["config.json"]
    assert (meta.commit_hash, meta.etag, meta.size) == (commit, git_blob_sha(config), len(config))

    mirror.reset_stats()
    out = Path(
        snapshot_download(
            repo_id="acme/tiny",
            revision="main",
            local_dir=tmp_path / "snapshot",
            cache_dir=tmp_path / "hf-cache",
            endpoint=mirror.endpoint,
            token=False,
        )
    )
    assert (out / "model.safetensors").read_bytes() == weights
    assert (out / "config.json").read_bytes() == files["config.json"]
    assert (out / ".gitattributes").read_bytes() == attrs

    assert mirror.request_count("GET", "/api/models/acme/tiny/revision/main") == 1
    assert mirror.request_count("GET", "/api/models/acme/tiny/tree/") >= 1
    for name, data in [*files.items(), (".gitattributes", attrs)]:
        path = f"/acme/tiny/resolve/{commit}/{name}"
        assert mirror.request_count("HEAD", path) == 1
        assert mirror.request_count("GET", path) == 1
        assert mirror.bytes_served("GET", path) == len(data)
    assert all(r.status in (200, 307) for r in mirror.requests())


def test_hf_hub_download_follows_new_commits(mirror: OlahServer, mirrors: Path, api: HfApi, tmp_path: Path) -> None:
    v1 = tiny_model(seed=1)
    first = create_model_repo(mirrors, "acme/evolving", v1)
    v2_config = json.dumps({"model_type": "tiny", "hidden_size": 32, "revision": 2}).encode()
    shard = tiny_model(seed=2)["model.safetensors"]
    second = add_commit(mirrors, "acme/evolving", {"config.json": v2_config, "extra/shard-2.safetensors": shard})
    assert second != first

    assert api.model_info("acme/evolving", revision="main").sha == second
    assert api.model_info("acme/evolving", revision=first).sha == first
    old, new = tree_files(api, "acme/evolving", first), tree_files(api, "acme/evolving", "main")
    assert set(new) - set(old) == {"extra/shard-2.safetensors"}
    extra = new["extra/shard-2.safetensors"].lfs
    assert extra is not None and extra.sha256 == sha256(shard)
    assert new["config.json"].blob_id == git_blob_sha(v2_config) != old["config.json"].blob_id
    assert new["model.safetensors"].lfs == old["model.safetensors"].lfs

    def download(name: str, revision: str) -> bytes:
        path = hf_hub_download(
            "acme/evolving",
            name,
            revision=revision,
            cache_dir=tmp_path / "hf-cache",
            endpoint=mirror.endpoint,
            token=False,
        )
        return Path(path).read_bytes()

    assert download("config.json", first) == v1["config.json"]
    assert download("config.json", "main") == v2_config
    assert download("extra/shard-2.safetensors", second) == shard

    third = add_commit(mirrors, "acme/evolving", {"extra/shard-2.safetensors": None})
    assert set(tree_files(api, "acme/evolving", "main")) == {
        ".gitattributes",
        "config.json",
        "model.safetensors",
    }
    assert api.model_info("acme/evolving", revision="main").sha == third


def test_request_counter_counts_requests_and_bytes(mirror: OlahServer, mirrors: Path, tmp_path: Path) -> None:
    files = tiny_model(seed=3)
    commit = create_model_repo(mirrors, "acme/counted", files)
    weights = files["model.safetensors"]
    mirror.reset_stats()
    assert mirror.requests() == []

    for _ in range(2):  # the second call finds the file in the cache: one HEAD, no GET
        hf_hub_download(
            "acme/counted",
            "model.safetensors",
            revision="main",
            cache_dir=tmp_path / "hf-cache",
            endpoint=mirror.endpoint,
            token=False,
        )
    path = "/acme/counted/resolve/main/model.safetensors"
    assert mirror.requests() == [
        ServedRequest("HEAD", path, 200, 0),
        ServedRequest("GET", path, 200, len(weights)),  # hf_hub_download GETs the revision it was given
        ServedRequest("HEAD", path, 200, 0),
    ]
    assert mirror.request_count() == 3
    assert mirror.request_count("head") == 2
    assert mirror.bytes_served() == len(weights)

    # Raw HTTP through the proxy counts too; olah ignores Range (200, whole body, chunked).
    request = urllib.request.Request(
        f"{mirror.endpoint}/acme/counted/resolve/{commit}/model.safetensors", headers={"Range": "bytes=0-9"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        assert response.read() == weights
    assert mirror.request_count() == 4
    assert mirror.bytes_served() == 2 * len(weights)


def test_missing_repository_is_repository_not_found(mirror: OlahServer, api: HfApi, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError) as info:
        api.model_info("acme/does-not-exist", revision="main")
    assert info.value.response.status_code in (401, 404)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/does-not-exist")
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download(
            repo_id="acme/does-not-exist",
            revision="main",
            local_dir=tmp_path / "snapshot",
            cache_dir=tmp_path / "hf-cache",
            endpoint=mirror.endpoint,
            token=False,
        )
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(
            "acme/does-not-exist",
            "config.json",
            cache_dir=tmp_path / "hf-cache",
            endpoint=mirror.endpoint,
            token=False,
        )


def test_olah_offline_quirks(mirror: OlahServer, mirrors: Path, api: HfApi, tmp_path: Path) -> None:
    """What olah 0.5.4 offline mode does differently from the Hub; the agent must cope with these."""
    create_model_repo(mirrors, "acme/quirks", tiny_model(seed=4))
    # files_metadata=True is ignored: siblings carry names only (use list_repo_tree for sizes / sha256).
    info = api.model_info("acme/quirks", revision="main", files_metadata=True)
    assert info.siblings and all(s.size is None and s.lfs is None for s in info.siblings)
    # A missing file, or an unknown branch, is reported as a missing repository (401 RepoNotFound).
    with pytest.raises((RepositoryNotFoundError, EntryNotFoundError)):
        hf_hub_download("acme/quirks", "nope.bin", cache_dir=tmp_path / "c", endpoint=mirror.endpoint, token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/quirks", revision="no-such-branch")


async def test_async_start_counts_and_stops(tmp_path: Path) -> None:
    mirrors = tmp_path / "mirrors"
    files = tiny_model(seed=5)
    commit = create_model_repo(mirrors, "acme/async", files)
    server = OlahServer(mirrors, tmp_path / "state")
    async with server:
        assert server.running
        assert server.startup_seconds is not None and server.startup_seconds < server.start_timeout
        env = {**os.environ, **server.client_env(), "HF_HOME": str(tmp_path / "hf-home")}
        script = (
            "import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(repo_id='acme/async', revision='main', local_dir=sys.argv[1]))"
        )
        # HF_ENDPOINT in the environment of a separate process, as the agent and the demo use it.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, str(tmp_path / "out"), env=env, stdout=subprocess.PIPE
        )
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        assert Path(out.decode().strip()).joinpath("model.safetensors").read_bytes() == files["model.safetensors"]
        assert server.request_count("GET", f"/acme/async/resolve/{commit}/model.safetensors") == 1
    assert not server.running
    assert server.request_count() > 0  # the records outlive the server
    assert not server.cache_dir.exists()  # offline mode serves local mirrors without caching them
