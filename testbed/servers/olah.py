"""A real Hugging Face mirror (``olah``) serving local git repositories, for the tests and the demo.

Role: the model source the end-to-end tests and the demo download from. Nothing here fakes the Hub API:
``olah`` (a self-hosted Hub mirror, pinned to :data:`OLAH_VERSION`) runs in offline mode with
``mirrors-path`` pointing at git repositories that this module writes, and ``huggingface_hub`` talks to
it through ``HF_ENDPOINT`` / ``endpoint=``.

Contract:

* :func:`ensure_olah` puts olah in its own virtual environment (its dependency pins are not ours) and
  returns the ``olah-cli`` executable; it does nothing when the pinned version is already installed.
* :func:`create_model_repo` / :func:`add_commit` write ``<root>/models/<org>/<name>``, a non-bare git
  repository on branch ``main`` - the layout olah's local mirrors expect. Files matching the LFS
  patterns are committed as git-lfs pointer files and their content is stored under
  ``.git/lfs/objects/<aa>/<bb>/<sha256>``, exactly where git-lfs puts it and where olah reads it, so
  the Hub API reports ``lfs.sha256`` and the LFS size for them. The ``git-lfs`` program is not needed.
* :class:`OlahServer` runs olah on a free loopback port with a generated config in a state directory,
  in front of which a small aiohttp reverse proxy (in its own thread and event loop) records the method,
  path, status and body bytes of every request. :attr:`OlahServer.endpoint` is the proxy, so clients
  pointed at it are counted. ``start``/``stop`` are blocking; ``astart``/``astop`` and ``async with``
  run them in a worker thread. A request is recorded before it is forwarded and its bytes are added
  before they are written, so the counters are complete as soon as a client call returns.
* Olah offline mode answers ``GET /api/models/<org>/<name>`` (repository info without a revision) with
  401 "Repository not found" for local mirrors: it looks only at its own cache for the newest commit.
  The proxy therefore forwards that one route, and only for existing local mirrors, to
  ``/api/models/<org>/<name>/revision/main``, what the Hub does when no revision is given; pass
  ``default_revision_shim=False`` to see olah's own answer. Records keep the path the client asked for.

What olah 0.5.4 offline mode serves from these repositories, seen through ``huggingface_hub``:

* works: ``snapshot_download``, ``hf_hub_download``, ``model_info(revision=branch or sha)`` (``sha`` is
  the resolved commit), ``list_repo_tree`` (size, ``blob_id`` = git blob sha1, ``lfs`` = sha256, size,
  pointer size), ``get_paths_info``, ``list_repo_refs``, ``get_hf_file_metadata`` (``etag`` = sha256 for
  LFS files and the git blob sha1 otherwise, ``commit_hash`` and ``size`` exact). No Xet headers are
  sent, so downloads are plain HTTP without setting ``HF_HUB_DISABLE_XET``.
* differs: ``files_metadata=True`` is ignored (siblings carry names only); a missing file or an unknown
  revision is a 401 "Repository not found" (``RepositoryNotFoundError``); ``/tree/<rev>`` is a 307 to
  ``/tree/<rev>/`` (two requests); resolve GETs ignore ``Range`` (200, whole body, chunked, no
  Content-Length) - ``huggingface_hub`` then restarts a resumed download from byte 0; each GET reads
  the whole file into memory and each HEAD of an LFS file hashes all of it, so keep models small;
  ``list_repo_commits`` fails in ``huggingface_hub`` (its commit entries lack ``authors[].user``).
* olah caches nothing for local mirrors: its ``repos-path`` stays empty and every request reads git.

Errors meant for a person are :class:`OlahError`, with a one-line message saying what to do. Olah is
stopped with SIGTERM, then SIGKILL after a deadline.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath

from aiohttp import web

from testbed.ports import free_port
from testbed.proxies.countingproxy import CountingProxy, ServedRequest
from testbed.servers.service import ManagedService, run_step, stop_process, wait_until_answering

OLAH_VERSION = "0.5.4"
OLAH_REQUIREMENT = f"olah=={OLAH_VERSION}"
DEFAULT_LFS_PATTERNS: tuple[str, ...] = ("*.safetensors", "*.bin")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
PIP_TIMEOUT_S = 15 * 60.0
GIT_TIMEOUT_S = 120.0

# The git-lfs pointer format (spec v1); olah recognises exactly this text in blobs of 121..149 bytes.
_LFS_SPEC = "https://git-lfs.github.com/spec/v1"
_LFS_ATTRS = "filter=lfs diff=lfs merge=lfs -text"
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMITTER = {
    "GIT_AUTHOR_NAME": "model-agent devenv",
    "GIT_AUTHOR_EMAIL": "devenv@model-agent.invalid",
    "GIT_COMMITTER_NAME": "model-agent devenv",
    "GIT_COMMITTER_EMAIL": "devenv@model-agent.invalid",
}


class OlahError(Exception):
    """A failure a person can act on; the message is one line that says what to do."""


def _one_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no output"
    return last if len(last) <= limit else last[: limit - 3] + "..."


def default_venv_dir() -> Path:
    """``$MODEL_AGENT_OLAH_VENV``, else ``.venv-olah`` at the root of the source checkout."""
    override = os.environ.get("MODEL_AGENT_OLAH_VENV")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / ".venv-olah"


# ----------------------------------------------------------------------------------------------- install


def _olah_installed(venv_dir: Path) -> bool:
    dist_infos = venv_dir.glob(f"lib/python3*/site-packages/olah-{OLAH_VERSION}.dist-info")
    return (venv_dir / "bin" / "olah-cli").is_file() and any(dist_infos)


def ensure_olah(venv_dir: Path) -> Path:
    """Install the pinned olah into its own venv at ``venv_dir`` unless it is there; return ``olah-cli``."""
    venv_dir = Path(venv_dir)
    cli = venv_dir / "bin" / "olah-cli"
    if _olah_installed(venv_dir):
        return cli
    python = venv_dir / "bin" / "python"
    if not python.is_file():
        base = getattr(sys, "_base_executable", None) or sys.executable
        made = subprocess.run(
            [base, "-m", "venv", str(venv_dir)], capture_output=True, text=True, check=False, timeout=300
        )
        if made.returncode != 0:
            raise OlahError(f"cannot create the olah venv {venv_dir}: {_one_line(made.stderr or made.stdout)}")
    argv = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", OLAH_REQUIREMENT]
    what = f"pip install {OLAH_REQUIREMENT} into {venv_dir}"
    pip = run_step(argv, what, OlahError, timeout_s=PIP_TIMEOUT_S, on_timeout="check the network")
    if pip.returncode != 0 or not _olah_installed(venv_dir):
        raise OlahError(f"{what} failed: {_one_line(pip.stderr or pip.stdout)}")
    return cli


# ----------------------------------------------------------------------------------------------- git repos


def _split_repo_id(repo_id: str) -> tuple[str, ...]:
    parts = tuple(repo_id.split("/"))
    if not 1 <= len(parts) <= 2 or not all(_REPO_PART.match(p) and ".." not in p for p in parts):
        raise OlahError(f"invalid repo id {repo_id!r}: use 'org/name' (letters, digits, '.', '_', '-')")
    return parts


def repo_dir(root: Path, repo_id: str) -> Path:
    """Where olah looks for the model ``repo_id`` when ``mirrors-path`` is ``root``."""
    return Path(root, "models", *_split_repo_id(repo_id))


def lfs_pointer(data: bytes) -> bytes:
    """The git-lfs pointer file for ``data``."""
    oid = hashlib.sha256(data).hexdigest()
    return f"version {_LFS_SPEC}\noid sha256:{oid}\nsize {len(data)}\n".encode("ascii")


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_COMMITTER)
    # Neither the user's nor the system's git config (e.g. a global git-lfs filter) may change what is stored.
    env.update({"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"})
    env["LC_ALL"] = "C"
    return env


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_git_env(), timeout=GIT_TIMEOUT_S)
    except FileNotFoundError as exc:
        raise OlahError("git is not on PATH: install git") from exc
    if done.returncode != 0:
        raise OlahError(f"git {args[0]} in {repo} failed: {_one_line(done.stderr or done.stdout)}")
    return done.stdout.strip()


def _check_path(path: str) -> PurePosixPath:
    p = PurePosixPath(path)
    bad_part = any(part in ("", ".", "..") for part in path.split("/"))
    if not path or p.is_absolute() or bad_part or p.parts[0] == ".git":
        raise OlahError(f"invalid file path {path!r}: use a relative path inside the repository")
    return p


def _lfs_patterns(repo: Path) -> list[str]:
    attrs = repo / ".gitattributes"
    if not attrs.is_file():
        return []
    patterns = []
    for line in attrs.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#") and "filter=lfs" in fields[1:]:
            patterns.append(fields[0])
    return patterns


def _is_lfs(path: PurePosixPath, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        target = str(path) if "/" in pattern.strip("/") else path.name
        if fnmatch.fnmatchcase(target, pattern.strip("/")):
            return True
    return False


def _write_files(repo: Path, files: Mapping[str, bytes | None]) -> None:
    patterns = _lfs_patterns(repo)
    for name, data in files.items():
        rel = _check_path(name)
        target = repo.joinpath(*rel.parts)
        if data is None:
            target.unlink(missing_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if data and _is_lfs(rel, patterns):  # git-lfs keeps empty files as they are
            oid = hashlib.sha256(data).hexdigest()
            obj = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
            if not obj.is_file():
                obj.parent.mkdir(parents=True, exist_ok=True)
                tmp = obj.with_name(oid + ".tmp")
                tmp.write_bytes(data)
                tmp.replace(obj)
            target.write_bytes(lfs_pointer(data))
        else:
            target.write_bytes(data)


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "--all")
    _git(repo, "commit", "--quiet", "--allow-empty", "--no-verify", "-m", message)
    if _git(repo, "symbolic-ref", "HEAD") != "refs/heads/main":
        raise OlahError(f"{repo} is not on branch main: check it out or recreate the repository")
    return _git(repo, "rev-parse", "HEAD")


def create_model_repo(
    root: Path,
    repo_id: str,
    files: Mapping[str, bytes],
    *,
    lfs_patterns: Iterable[str] = DEFAULT_LFS_PATTERNS,
) -> str:
    """Create the mirror repository of model ``repo_id`` under ``root`` with one commit on ``main``.

    ``.gitattributes`` marks ``lfs_patterns`` (matched against the file name, or the whole path when the
    pattern contains ``/``) as LFS, as on the Hub; it is part of the commit. Returns the commit sha.
    """
    repo = repo_dir(root, repo_id)
    if repo.exists():
        raise OlahError(f"{repo} already exists: use add_commit, or remove it first")
    repo.mkdir(parents=True)
    _git(repo, "init", "--quiet", "--initial-branch=main")
    attrs = "".join(f"{pattern} {_LFS_ATTRS}\n" for pattern in lfs_patterns)
    (repo / ".gitattributes").write_text(attrs)
    _write_files(repo, files)
    return _commit(repo, f"Create {repo_id}")


def add_commit(root: Path, repo_id: str, files: Mapping[str, bytes | None], *, message: str | None = None) -> str:
    """Commit ``files`` on ``main`` of an existing mirror repository; ``None`` deletes a file.

    Other files are kept. LFS patterns come from the repository's ``.gitattributes``. Returns the new sha.
    """
    repo = repo_dir(root, repo_id)
    if not (repo / ".git").is_dir():
        raise OlahError(f"{repo} is not a mirror repository: create it with create_model_repo")
    _write_files(repo, files)
    return _commit(repo, message or f"Update {repo_id}")


# ----------------------------------------------------------------------------------------------- proxy


def _default_revision_shim(mirrors_root: Path) -> Callable[[web.Request], str]:
    """Forward ``GET /api/models/<org>/<name>`` for a local mirror to its ``/revision/main`` (see the module doc)."""

    def rewrite(request: web.Request) -> str:
        raw = request.raw_path
        if request.method in ("GET", "HEAD"):
            m = re.fullmatch(r"/api/models/([^/?]+)/([^/?]+)(\?.*)?", raw)
            if m and (mirrors_root / "models" / m[1] / m[2]).is_dir():
                return f"/api/models/{m[1]}/{m[2]}/revision/main{m[3] or ''}"
        return raw

    return rewrite


# ----------------------------------------------------------------------------------------------- server


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string for paths


class OlahServer(ManagedService):
    """Olah in offline mode over the git mirrors in ``mirrors_root``, behind a counting proxy.

    Use as ``with OlahServer(root, state_dir) as mirror:`` or ``async with``; clients use
    :attr:`endpoint`. Olah's config, log and (unused in offline mode) cache live in ``state_dir``.
    """

    def __init__(
        self,
        mirrors_root: Path,
        state_dir: Path,
        *,
        venv_dir: Path | None = None,
        default_revision_shim: bool = True,
        start_timeout: float = START_TIMEOUT_S,
        stop_timeout: float = STOP_TIMEOUT_S,
    ) -> None:
        self.mirrors_root = Path(mirrors_root).resolve()
        self.state_dir = Path(state_dir).resolve()
        self.config_path = self.state_dir / "olah.toml"
        self.log_path = self.state_dir / "olah.out"  # Olah's stdout and stderr (uvicorn's access log included)
        # Olah's ``repos-path``; offline mode serves local mirrors without writing here.
        self.cache_dir = self.state_dir / "repos"
        self.venv_dir = Path(venv_dir) if venv_dir is not None else default_venv_dir()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.startup_seconds: float | None = None
        self._shim = default_revision_shim
        self._proc: subprocess.Popen[bytes] | None = None
        self._proxy: CountingProxy | None = None
        self._olah_port = 0

    # -- addresses and files
    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>`` of the counting proxy: what ``HF_ENDPOINT`` should be."""
        if self._proxy is None or not self._proxy.port:
            raise OlahError("the olah mirror is not running: call start() first")
        return f"http://127.0.0.1:{self._proxy.port}"

    @property
    def olah_endpoint(self) -> str:
        """Olah itself, bypassing the counters."""
        if not self._olah_port:
            raise OlahError("the olah mirror is not running: call start() first")
        return f"http://127.0.0.1:{self._olah_port}"

    def client_env(self) -> dict[str, str]:
        """Environment for a ``huggingface_hub`` process that should download from this mirror."""
        return {"HF_ENDPOINT": self.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}

    # -- request counters
    def requests(self) -> list[ServedRequest]:
        """Every request served since start or :meth:`reset_stats`, in arrival order (a copy)."""
        return self._proxy.records() if self._proxy is not None else []

    def request_count(self, method: str | None = None, path_contains: str | None = None) -> int:
        return len(self._select(method, path_contains))

    def bytes_served(self, method: str | None = None, path_contains: str | None = None) -> int:
        """Response body bytes sent to clients (HEAD responses count 0)."""
        return sum(r.bytes_sent for r in self._select(method, path_contains))

    def reset_stats(self) -> None:
        if self._proxy is not None:
            self._proxy.reset()

    def _select(self, method: str | None, path_contains: str | None) -> list[ServedRequest]:
        return [
            r
            for r in self.requests()
            if (method is None or r.method == method.upper()) and (path_contains is None or path_contains in r.path)
        ]

    # -- lifecycle
    def _write_config(self, proxy_port: int) -> None:
        netloc = f"127.0.0.1:{proxy_port}"
        # Offline mode never contacts the upstream; point it at the discard port so nothing could leak.
        nowhere = "127.0.0.1:9"
        lines = [
            "[basic]",
            'host = "127.0.0.1"',
            f"port = {self._olah_port}",
            f"repos-path = {_toml_str(str(self.cache_dir))}",
            f"mirrors-path = [{_toml_str(str(self.mirrors_root))}]",
            'hf-scheme = "http"',
            f"hf-netloc = {_toml_str(nowhere)}",
            f"hf-lfs-netloc = {_toml_str(nowhere)}",
            'mirror-scheme = "http"',
            f"mirror-netloc = {_toml_str(netloc)}",
            f"mirror-lfs-netloc = {_toml_str(netloc)}",
            "",
            "[accessibility]",
            "offline = true",
            "",
        ]
        self.config_path.write_text("\n".join(lines))

    def start(self) -> None:
        """Start olah and the proxy; return once olah answers HTTP, or raise :class:`OlahError`.

        Installs olah first if needed (not counted in ``start_timeout`` nor in ``startup_seconds``).
        """
        if self._proc is not None:
            return
        cli = ensure_olah(self.venv_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.mirrors_root.mkdir(parents=True, exist_ok=True)
        self._proxy = CountingProxy(rewrite=_default_revision_shim(self.mirrors_root) if self._shim else None)
        try:
            self._proxy.start()
            for _ in range(3):  # the free port we picked can be taken before olah binds it
                began = time.monotonic()
                self._olah_port = free_port()
                self._proxy.upstream = self.olah_endpoint
                self._write_config(self._proxy.port)
                log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
                self._spawn(cli)
                if self._wait_ready(began + self.start_timeout, log_offset):
                    break
            else:
                raise OlahError(f"olah could not bind a free loopback port three times: see {self.log_path}")
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def _spawn(self, cli: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env["PYTHONUNBUFFERED"] = "1"
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [str(cli), "-c", str(self.config_path), "--log-path", str(self.state_dir / "logs")],
                cwd=self.state_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _wait_ready(self, deadline: float, log_offset: int) -> bool:
        """True once olah answers; False if it exited because its port was taken; else raise."""
        assert self._proc is not None
        # Any HTTP answer means uvicorn finished start-up. "/" is no use: olah 0.5.4's index template
        # fails with starlette 1.x (500 and a traceback in the log). An unknown repository is a cheap 401.
        url = f"{self.olah_endpoint}/api/models/model-agent/readiness-probe/revision/main"
        try:
            code = wait_until_answering(self._proc, url, deadline)
        except TimeoutError:
            raise OlahError(
                f"olah did not answer on {url} within {self.start_timeout:.0f}s: see {self.log_path}"
            ) from None
        if code is None:
            return True
        self._proc = None
        with self.log_path.open("rb") as log:
            log.seek(log_offset)
            output = log.read().decode(errors="replace")
        if "address already in use" in output:
            return False
        raise OlahError(f"olah exited with code {code} during start-up: {_one_line(output)} (log: {self.log_path})")

    def stop(self) -> None:
        """Stop the proxy and olah (SIGTERM, then SIGKILL after ``stop_timeout``). Idempotent."""
        if self._proxy is not None:
            self._proxy.stop()
        proc, self._proc = self._proc, None
        stop_process(proc, signal.SIGTERM, self.stop_timeout)
        self._olah_port = 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.servers.olah ensure``: install the pinned olah into its own venv."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["ensure"]:
        print("usage: python -m testbed.servers.olah ensure", file=sys.stderr)
        return 2
    try:
        exe = ensure_olah(default_venv_dir())
    except OlahError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"olah {OLAH_VERSION}: {exe}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
