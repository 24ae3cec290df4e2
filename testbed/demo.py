"""``python -m testbed demo``: the agent doing its real job on this machine, start to finish, then cleaned up.

Role: one command that shows a newcomer what the agent does, against real components only. It starts a
real kube-apiserver and etcd (built on first use, then cached: :mod:`testbed.servers.controlplane`)
with one Node ``demo-node``, a real Hugging Face mirror (olah, :mod:`testbed.servers.olah`) serving a
freshly made tiny llama-shaped model ``acme/tiny-llama``, and ``model-agent run`` as a subprocess. Then:

1. it creates the ClusterBaseModel ``tiny-llama`` and shows, live, the Node label and the ConfigMap entry
   going ``Updating`` -> ``Ready`` (polling the API server with a deadline);
2. it prints the label, the ConfigMap entry and the agent's ``/status`` table;
3. it deletes the model and shows the label and the entry going away and the weights landing in the trash
   (``<models-root>/.model-agent/trash``) once the agent confirmed the deletion with a live read, with the
   ``model_agent_delete_confirmations_total{outcome="confirmed_gone"}`` metric line.

Contract:

* Everything lives in one work directory, a new temporary one unless ``--work-dir`` is given (removed
  after a successful run; kept after a failure, for its logs). The control plane's state directory is
  ``<work>/controlplane``, so it never collides with ``python -m testbed`` or a test session. A reused work
  directory is reset: the demo's own sub-directories (models, mirrors, HF home) are recreated.
* Every process it starts is stopped in ``finally`` blocks - the agent (SIGTERM), the mirror, the control
  plane - unless ``--keep``, which leaves them running and prints how to reach and stop them.
* Exit 0 when every step worked. Otherwise one ``error:`` line on stderr (followed by the last lines of the
  agent's log when the agent is involved) and exit 1; exit 2 when a component could not be started.
* Readable without a terminal (CI): the live views degrade to their final state, which is printed.

The model it serves is the test bed's tiny llama (:mod:`testbed.models`), the one the tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from model_agent.cli.status import render as render_status
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import CLUSTERBASEMODELS, CONFIGMAPS, NODES
from model_agent.local.layout import Layout
from model_agent.local.trash import Trash
from model_agent.model.keys import ModelKind, configmap_key, node_label_key
from testbed.agent_process import AgentProcess, AgentProcessError
from testbed.models import tiny_llama
from testbed.servers.controlplane import ControlPlane, ControlPlaneError
from testbed.servers.olah import OlahError, OlahServer, create_model_repo, default_venv_dir, ensure_olah

NODE = "demo-node"
MODEL = "tiny-llama"
REPO = "acme/tiny-llama"
NAMESPACE = "ome"
AGENT_ARGS = ("--resync-interval", "10", "--delete-settle", "1", "--trash-grace", "3600")
AGENT_READY_TIMEOUT_S = 120.0
AGENT_STOP_TIMEOUT_S = 20.0
POLL_S = 0.1
LOG_TAIL_LINES = 20
NON_TERMINAL_WIDTH = 120
CONFIRMED_METRIC = 'model_agent_delete_confirmations_total{outcome="confirmed_gone"}'

LABEL_KEY = node_label_key(ModelKind.CLUSTER_BASE_MODEL, "", MODEL)
ENTRY_KEY = configmap_key(ModelKind.CLUSTER_BASE_MODEL, "", MODEL)


class DemoError(Exception):
    """A step failed; ``str()`` is one line, ``details`` (e.g. the agent log's tail) follow it."""

    def __init__(self, message: str, *, details: str = "", code: int = 1) -> None:
        super().__init__(message)
        self.details = details
        self.code = code


# ------------------------------------------------------------------------------------------- the model

# ------------------------------------------------------------------------------------------- helpers


def _fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _pids_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (this process excluded)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(proc.name))
    return sorted(found)


def cluster_base_model(dest: Path) -> dict[str, Any]:
    return {
        "apiVersion": "ome.io/v1beta1",
        "kind": "ClusterBaseModel",
        "metadata": {"name": MODEL},
        "spec": {"storage": {"storageUri": f"hf://{REPO}", "path": str(dest)}},
    }


# ------------------------------------------------------------------------------------------- the agent


class DemoAgent(AgentProcess):
    """The test bed's agent process for ``demo-node``, failing with :class:`DemoError` and the log's tail."""

    def __init__(self, *, kubeconfig: Path, models_root: Path, log_path: Path, hf_endpoint: str, hf_home: Path):
        super().__init__(
            kubeconfig=kubeconfig,
            node=NODE,
            models_root=models_root,
            log_path=log_path,
            hf_endpoint=hf_endpoint,
            hf_home=hf_home,
            args=AGENT_ARGS,
            log_level="info",
        )

    def failure(self, message: str) -> DemoError:
        """A DemoError carrying the last lines of the agent log."""
        return DemoError(message, details=f"last {LOG_TAIL_LINES} lines of {self.log_path}:\n{_tail(self.log_path)}")

    def check_alive(self) -> None:
        """Raise the demo's error when the agent process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self.failure(f"the agent exited with code {self.proc.returncode}")

    def wait_ready(self, timeout: float = AGENT_READY_TIMEOUT_S) -> float:
        """As the test bed's, but a failure is the demo's one-line error followed by the log's tail."""
        try:
            return super().wait_ready(timeout)
        except AgentProcessError as exc:
            raise self.failure(str(exc).split(";", 1)[0]) from None


# ------------------------------------------------------------------------------------------- live views


@dataclass
class Observed:
    """What the API server (and the disk, and the agent's metrics) said at one poll."""

    label: str | None = None
    entry: dict[str, Any] | None = None
    trash: list[dict[str, Any]] = field(default_factory=list)
    confirmed: float = 0.0
    error: str = ""

    @property
    def entry_status(self) -> str | None:
        return None if self.entry is None else str(self.entry.get("status"))

    @property
    def progress(self) -> str:
        prog = (self.entry or {}).get("progress")
        if not isinstance(prog, dict):
            return "-"
        return (
            f"{prog.get('phase') or '?'}: {prog.get('completedFiles', 0)}/{prog.get('totalFiles', 0)} files, "
            f"{_fmt_bytes(int(prog.get('completedBytes', 0)))}/{_fmt_bytes(int(prog.get('totalBytes', 0)))}"
        )


@dataclass
class Timeline:
    """The transitions seen during one live view, as ``+seconds  text`` lines."""

    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    last: tuple[Any, ...] | None = None

    def note(self, state: tuple[Any, ...], text: str) -> None:
        if state != self.last:
            self.last = state
            self.lines.append(f"+{time.monotonic() - self.started:5.1f}s  {text}")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _show(value: str | None) -> Text:
    if value is None:
        return Text("(absent)", style="dim")
    style = {"Ready": "bold green", "Updating": "yellow", "Failed": "bold red"}.get(value, "")
    return Text(value, style=style)


def _view(title: str, rows: list[tuple[str, RenderableType]], timeline: Timeline, footer: str) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, value in rows:
        grid.add_row(name, value)
    log = Text("\n".join(timeline.lines[-8:]) or "(waiting for the first change)")
    return Panel(Group(grid, Text(""), Text("transitions:", style="bold"), log), title=title, subtitle=footer)


# ------------------------------------------------------------------------------------------- the run


class Demo:
    """One run of the demo in one work directory: start the components, run the scenario, clean up."""

    def __init__(self, work: Path, console: Console, *, keep: bool, timeout: float) -> None:
        self.work = work
        self.console = console
        self.keep = keep
        self.timeout = timeout
        self.plane = ControlPlane(work / "controlplane")
        self.mirrors = work / "mirrors"
        self.models_root = work / "models"
        self.dest = self.models_root / MODEL
        self.manifest_path = work / f"{MODEL}.yaml"
        self.mirror: OlahServer | None = None
        self.agent: DemoAgent | None = None

    # ---- printing

    def step(self, n: int, text: str) -> None:
        self.console.print()
        self.console.print(Text(f"[{n}/7] {text}", style="bold cyan"), soft_wrap=True)

    def say(self, text: str, style: str = "") -> None:
        self.console.print(Text(text, style=style), soft_wrap=True)

    def _echo(self, message: str) -> None:
        self.say(f"      {message}", "dim")

    # ---- the whole thing

    def run(self) -> None:
        if left := self._leftovers():  # checked before any cleanup is armed: never stop another run's processes
            raise DemoError(
                f"processes of an earlier run in {self.work} still run (pids {' '.join(map(str, left))}): "
                f"stop them, then `python -m testbed down --state-dir {self.plane.state_dir}`, "
                "or use another --work-dir",
                code=2,
            )
        with contextlib.ExitStack() as stack:
            stack.callback(self._stop_plane)
            stack.callback(self._stop_mirror)
            stack.callback(self._stop_agent)
            try:
                self._start_components()
                asyncio.run(self._scenario())
            except BaseException:
                self.step(7, "cleaning up after the failure")
                raise
            if self.keep:
                stack.pop_all()
                self._print_keep()
            else:
                self.step(7, "cleaning up")

    def _leftovers(self) -> list[int]:
        """Processes an earlier (e.g. ``--keep``) run in this work dir started and that still run.

        Matched on the sub-directories they name on their command lines, never on the work dir alone (this
        command's own line, and a wrapper's such as ``timeout``, name that too).
        """
        pids: set[int] = set()
        for sub in (self.plane.state_dir, self.models_root, self.work / "olah"):
            pids.update(_pids_mentioning(str(sub)))
        return sorted(pids)

    def _reset_work_dir(self) -> None:
        for path in (self.mirrors, self.models_root, self.work / "hf-home", self.work / "olah"):
            shutil.rmtree(path, ignore_errors=True)
        (self.work / "agent.log").unlink(missing_ok=True)

    def _start_components(self) -> None:
        self.step(1, f"starting a real kube-apiserver + etcd (Node {NODE}) and a Hugging Face mirror (olah)")
        self._reset_work_dir()
        try:
            self.plane.up([NODE], echo=self._echo)
            ensure_olah(default_venv_dir())
            files = tiny_llama()
            commit = create_model_repo(self.mirrors, REPO, files)
            sizes = ", ".join(f"{name} {_fmt_bytes(len(data))}" for name, data in files.items())
            self.say(f"      mirror repository {REPO} @ {commit[:12]}: {sizes}")
            self.mirror = OlahServer(self.mirrors, self.work / "olah")
            self.mirror.start()
        except (ControlPlaneError, OlahError) as exc:
            raise DemoError(str(exc), code=2) from None
        self.say(f"      olah serves {REPO} at {self.mirror.endpoint}")

        self.step(2, "starting the agent: model-agent run " + " ".join(AGENT_ARGS))
        # With --keep the agent outlives this process and its counting proxy, so it talks to olah itself.
        endpoint = self.mirror.olah_endpoint if self.keep else self.mirror.endpoint
        self.agent = DemoAgent(
            kubeconfig=self.plane.kubeconfig,
            models_root=self.models_root,
            log_path=self.work / "agent.log",
            hf_endpoint=endpoint,
            hf_home=self.work / "hf-home",
        )
        self.agent.start()
        took = self.agent.wait_ready(AGENT_READY_TIMEOUT_S)
        self.say(
            f"      agent pid {self.agent.pid} ready in {took:.1f}s on http://127.0.0.1:{self.agent.port} "
            f"(models root {self.models_root}, log {self.agent.log_path})"
        )

    # ---- cleanup (each one runs even when another failed)

    def _stop_agent(self) -> None:
        if self.agent is not None:
            was_running = self.agent.alive()
            took = self.agent.stop(AGENT_STOP_TIMEOUT_S, must_stop=False)
            if was_running:
                self.say(f"      agent stopped (SIGTERM) in {took:.1f}s")

    def _stop_mirror(self) -> None:
        if self.mirror is not None:
            self.mirror.stop()
            self.say("      mirror stopped")

    def _stop_plane(self) -> None:
        if self.plane.down():
            self.say("      control plane stopped")

    def _print_keep(self) -> None:
        assert self.agent is not None and self.mirror is not None
        olah = _pids_mentioning(str(self.work / "olah"))
        kill = " ".join(str(p) for p in [self.agent.pid, *olah])
        self.step(7, "--keep: everything is still running")
        for line in (
            f"export KUBECONFIG={self.plane.kubeconfig}",
            f"kubectl get node {NODE} --show-labels",
            f"kubectl get configmap -n {NAMESPACE} {NODE} -o yaml",
            f"model-agent status --port {self.agent.port}",
            f"model-agent trash list --models-root-dir {self.models_root}",
            f"kubectl apply -f {self.manifest_path}   # back from the trash by rename, no download",
            f"tail -f {self.agent.log_path}",
            f"# the mirror: HF_ENDPOINT={self.mirror.olah_endpoint}",
            f"# stop it all: kill {kill}; python -m testbed down --state-dir {self.plane.state_dir}",
        ):
            self.say(f"  {line}")

    # ---- the scenario against the API server

    async def _scenario(self) -> None:
        client = await KubeClient.connect(self.plane.kubeconfig)
        try:
            await self._create_and_watch_ready(client)
            await self._show_ready(client)
            await self._delete_and_watch_removal(client)
        finally:
            await client.close()

    async def _observe(self, client: KubeClient, *, removal: bool = False) -> Observed:
        seen = Observed()
        try:
            node = await client.request("GET", NODES.path(name=NODE), timeout=5)
            seen.label = (node.get("metadata", {}).get("labels") or {}).get(LABEL_KEY)
            try:
                cm = await client.request("GET", CONFIGMAPS.path(NAMESPACE, NODE), timeout=5)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                cm = {}
            raw = (cm.get("data") or {}).get(ENTRY_KEY)
            seen.entry = json.loads(raw) if raw else None
        except (ApiError, ApiUnavailable, ValueError) as exc:
            seen.error = str(exc)
        if removal:
            seen.trash = await asyncio.to_thread(self._trash_entries)
            line = await asyncio.to_thread(self._metric_line)
            seen.confirmed = float(line.rsplit(" ", 1)[1]) if line else 0.0
        return seen

    def _trash_entries(self) -> list[dict[str, Any]]:
        return [e.to_json() for e in Trash(Layout(self.models_root)).entries() if e.manifest.dest == str(self.dest)]

    def _metric_line(self) -> str | None:
        assert self.agent is not None
        return self.agent.metric_line(CONFIRMED_METRIC)

    async def _create_and_watch_ready(self, client: KubeClient) -> None:
        assert self.agent is not None
        body = cluster_base_model(self.dest)
        await asyncio.to_thread(self.manifest_path.write_text, yaml.safe_dump(body, sort_keys=False))
        self.step(3, f"creating ClusterBaseModel {MODEL}: storageUri hf://{REPO}, path {self.dest}")
        try:
            await client.request("POST", CLUSTERBASEMODELS.path(), body=body)
        except (ApiError, ApiUnavailable) as exc:
            raise DemoError(f"could not create ClusterBaseModel {MODEL}: {exc}") from None

        self.step(4, f"waiting for the agent to fetch it and mark it Ready on {NODE}")
        timeline = Timeline()
        seen = Observed()

        def view() -> Panel:
            rows: list[tuple[str, RenderableType]] = [
                ("node label", Text.assemble(f"{LABEL_KEY} = ", _show(seen.label))),
                (f"ConfigMap {NAMESPACE}/{NODE}", Text.assemble(f"{ENTRY_KEY}: status ", _show(seen.entry_status))),
                ("progress", Text(seen.progress)),
            ]
            if seen.error:
                rows.append(("last API error", Text(seen.error, style="red")))
            return _view(f"{MODEL} on {NODE}", rows, timeline, f"{timeline.elapsed:.1f}s / {self.timeout:g}s")

        with self._live(view()) as live:
            while True:
                seen = await self._observe(client)
                text = f"label={seen.label or '(absent)'}  entry={seen.entry_status or '(absent)'}"
                if seen.progress != "-":
                    text += f"  progress {seen.progress}"
                timeline.note((seen.label, seen.entry_status, seen.progress), text)
                live.update(view())
                if seen.label == "Ready" and seen.entry_status == "Ready":
                    break
                await asyncio.to_thread(self.agent.check_alive)
                if seen.label == "Failed" or seen.entry_status == "Failed":
                    reason = (seen.entry or {}).get("reason", "no reason given")
                    raise self.agent.failure(f"the agent marked {MODEL} Failed: {reason}")
                if timeline.elapsed > self.timeout:
                    raise self.agent.failure(
                        f"{MODEL} not Ready on {NODE} within {self.timeout:g}s "
                        f"(label {seen.label}, entry {seen.entry_status})"
                    )
                await asyncio.sleep(POLL_S)
        self.say(f"Ready after {timeline.elapsed:.1f}s: label and ConfigMap entry both say Ready", "bold green")

    async def _show_ready(self, client: KubeClient) -> None:
        assert self.agent is not None
        self.step(5, "what the rest of the cluster sees")
        node = await client.request("GET", NODES.path(name=NODE))
        labels = node.get("metadata", {}).get("labels") or {}
        self.say(f"$ kubectl get node {NODE} --show-labels", "dim")
        self.say(f"{'NAME':<12}LABELS")
        self.say(f"{NODE:<12}" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
        self.say(f"  -> inference pods select this node with {LABEL_KEY}={labels.get(LABEL_KEY)}", "green")
        cm = await client.request("GET", CONFIGMAPS.path(NAMESPACE, NODE))
        self.say(f"$ kubectl get configmap -n {NAMESPACE} {NODE}   # data[{ENTRY_KEY!r}]:", "dim")
        self.console.print_json(data=json.loads((cm.get("data") or {})[ENTRY_KEY]))
        files = await asyncio.to_thread(
            lambda: sorted((p.relative_to(self.dest), p.stat().st_size) for p in self.dest.rglob("*") if p.is_file())
        )
        self.say(f"weights on disk in {self.dest}: " + ", ".join(f"{p} {_fmt_bytes(n)}" for p, n in files))
        if self.mirror is not None and not self.keep:
            self.say(
                f"the mirror served {self.mirror.request_count()} requests, "
                f"{_fmt_bytes(self.mirror.bytes_served())} of content"
            )
        status_code, body = await asyncio.to_thread(self.agent.http, "/status")
        if status_code != 200:
            raise self.agent.failure(f"the agent's /status answered {status_code}")
        self.say(f"$ model-agent status --port {self.agent.port}", "dim")
        render_status(json.loads(body), self.console)

    async def _delete_and_watch_removal(self, client: KubeClient) -> None:
        assert self.agent is not None
        self.step(6, f"deleting ClusterBaseModel {MODEL}: the agent confirms it is gone, then cleans up")
        try:
            await client.request("DELETE", CLUSTERBASEMODELS.path(name=MODEL))
        except (ApiError, ApiUnavailable) as exc:
            raise DemoError(f"could not delete ClusterBaseModel {MODEL}: {exc}") from None
        timeline = Timeline()
        seen = Observed()

        def view() -> Panel:
            trash = ", ".join(f"{e['id']} ({_fmt_bytes(int(e['bytes']))})" for e in seen.trash) or "(empty)"
            rows: list[tuple[str, RenderableType]] = [
                ("node label", Text.assemble(f"{LABEL_KEY} = ", _show(seen.label))),
                (f"ConfigMap {NAMESPACE}/{NODE}", Text.assemble(f"{ENTRY_KEY}: ", _show(seen.entry_status))),
                ("weights", Text(str(self.dest) + (" (present)" if self.dest.exists() else " (moved)"))),
                ("trash", Text(trash)),
                ("confirmed_gone", Text(f"{seen.confirmed:g}")),
            ]
            if seen.error:
                rows.append(("last API error", Text(seen.error, style="red")))
            return _view(f"removing {MODEL}", rows, timeline, f"{timeline.elapsed:.1f}s / {self.timeout:g}s")

        with self._live(view()) as live:
            while True:
                seen = await self._observe(client, removal=True)
                timeline.note(
                    (seen.label, seen.entry_status, len(seen.trash), seen.confirmed),
                    f"label={seen.label or '(absent)'}  entry={seen.entry_status or '(absent)'}  "
                    f"trash={len(seen.trash)}  confirmed_gone={seen.confirmed:g}",
                )
                live.update(view())
                if seen.label is None and seen.entry is None and seen.trash and seen.confirmed >= 1 and not seen.error:
                    break
                await asyncio.to_thread(self.agent.check_alive)
                if timeline.elapsed > self.timeout:
                    raise self.agent.failure(
                        f"{MODEL} not cleaned up within {self.timeout:g}s (label {seen.label}, entry "
                        f"{seen.entry_status}, {len(seen.trash)} trash entries, confirmed_gone {seen.confirmed:g})"
                    )
                await asyncio.sleep(POLL_S)
        self.say(
            f"removed after {timeline.elapsed:.1f}s: label and ConfigMap entry gone, weights moved to the trash",
            "bold green",
        )
        trash_dir = Layout(self.models_root).primary.trash
        self.say(f"$ cat {trash_dir}/*/entry.json   # (id, model, bytes)", "dim")
        for entry in seen.trash:
            self.say(f"  {entry['id']}  {entry['key']}  {entry['bytes']} bytes  ({entry['reason']})")
        line = await asyncio.to_thread(self._metric_line)
        self.say(f"$ curl -s http://127.0.0.1:{self.agent.port}/metrics | grep confirmed_gone", "dim")
        self.say(f"  {line}")
        self.say(
            "  the deletion was confirmed by a live read of the object (NotFound) before anything was removed",
            "dim",
        )

    @contextlib.contextmanager
    def _live(self, first: RenderableType) -> Iterator[Live]:
        """A live view refreshed 4 times a second; without a terminal rich prints only its last frame."""
        try:
            with Live(first, console=self.console, refresh_per_second=4) as live:
                yield live
        finally:
            if not self.console.is_terminal:  # that last frame comes without a final newline
                self.console.line()


# ------------------------------------------------------------------------------------------- command


def demo(
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            help="Where everything lives (default: a new temporary directory, removed after success). "
            "Its demo sub-directories are reset on each run.",
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the control plane, mirror and agent running; print how to reach them.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for Ready, and then for the cleanup.")] = 90.0,
) -> None:
    """Show the agent at work on this machine: real API server, real HF mirror, a model Ready, then deleted."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=NON_TERMINAL_WIDTH)  # CI logs: rich's 80 columns would squeeze the tables
    temporary = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="model-agent-demo-")) if work_dir is None else work_dir
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    console.print(Text(f"testbed demo: work directory {work}", style="bold"), soft_wrap=True)
    run = Demo(work, console, keep=keep, timeout=timeout)
    code = 0
    try:
        run.run()
    except DemoError as exc:
        code = exc.code
        typer.echo(f"error: {exc}", err=True)
        if exc.details:
            typer.echo(exc.details, err=True)
    except (ApiError, ApiUnavailable, OSError) as exc:
        code = 1
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
    except KeyboardInterrupt:
        code = 130
        typer.echo("error: interrupted; everything it started was stopped", err=True)
    if code == 0:
        if temporary and not keep:
            shutil.rmtree(work, ignore_errors=True)
        console.print(Text("demo finished: every step worked", style="bold green"))
    else:
        typer.echo(f"(logs kept in {work})", err=True)
        raise typer.Exit(code=code)
