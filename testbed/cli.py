"""``python -m testbed``: the local control plane for tests and the demo, and the demo itself.

``up`` builds (first time) and starts a real kube-apiserver and etcd on loopback and prints the kubeconfig
path; ``down`` stops it (exit 0 when nothing runs); ``status`` says what runs where; ``build`` only builds.
Every failure a person can fix is one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from testbed import demo
from testbed import image as agent_image
from testbed.servers import azurite, fakegcs, olah
from testbed.servers import controlplane as cp
from testbed.servers import node as realnode

app = typer.Typer(
    help="The test bed: a real local Kubernetes control plane (kube-apiserver + etcd), emulators, and the demo.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("demo")(demo.demo)

StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="Where pids, PKI, logs and the kubeconfig live (default: user cache)."),
]


def _echo(message: str) -> None:
    typer.echo(message, err=True)


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code=2)


@app.command()
def up(
    state_dir: StateDir = None,
    node: Annotated[list[str] | None, typer.Option("--node", help="Create a Node with this name (repeatable).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="kube-apiserver port (default: a free one).")] = None,
    with_node: Annotated[
        bool,
        typer.Option(
            "--with-node", help="Also run a real node: kubelet, containerd, controller manager, scheduler (root)."
        ),
    ] = False,
) -> None:
    """Build if needed, start, bootstrap CRDs/Namespace/Nodes; print the kubeconfig path on stdout."""
    plane = cp.ControlPlane(state_dir)
    try:
        if with_node:
            real = realnode.Node(plane)
            real.preflight()
            built = agent_image.build_agent_image(echo=_echo)
            plane.up(node or [], apiserver_port=port, echo=_echo, real_nodes=realnode.apiserver_flags)
            real.up(images=[(built.archive, built.ref)], echo=_echo)
            _echo(f"agent image {built.ref} imported; models root {real.models_root}")
        else:
            plane.up(node or [], apiserver_port=port, echo=_echo)
    except (cp.ControlPlaneError, agent_image.ImageError) as exc:
        raise _fail(exc) from None
    typer.echo(str(plane.kubeconfig))


@app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop the control plane recorded in the state directory. Exit 0 when nothing was running."""
    plane = cp.ControlPlane(state_dir)
    real = realnode.Node(plane)
    if real.read_state() is not None or real.snapshot_file.is_file():
        failures = real.down()
        for failure in failures:
            _echo(f"could not restore: {failure}")
        _echo("stopped the node and restored the host" if not failures else "stopped the node")
    if plane.down():
        _echo(f"stopped the control plane in {plane.state_dir}")
    else:
        _echo(f"nothing running in {plane.state_dir}")


@app.command()
def status(state_dir: StateDir = None) -> None:
    """Show whether the control plane runs, its ports and kubeconfig. Exit 1 when it does not run."""
    plane = cp.ControlPlane(state_dir)
    state = plane.running()
    if state is None:
        typer.echo(f"not running (state dir {plane.state_dir})")
        raise typer.Exit(code=1)
    typer.echo(
        f"running: kube-apiserver https://127.0.0.1:{state.apiserver_port} (pid {state.apiserver_pid}), "
        f"etcd 127.0.0.1:{state.etcd_port} (pid {state.etcd_pid}), nodes {', '.join(state.nodes) or '-'}\n"
        f"KUBECONFIG={state.kubeconfig}"
    )


@app.command("build")
def build_cmd(
    force: Annotated[bool, typer.Option(help="Rebuild even when cached.")] = False,
    with_helm: Annotated[bool, typer.Option("--with-helm", help="Also build helm (for chart tests).")] = False,
    with_emulators: Annotated[
        bool,
        typer.Option(
            "--with-emulators", help="Also build fake-gcs-server and install Azurite (gs:// and az:// tests)."
        ),
    ] = False,
    with_olah: Annotated[
        bool, typer.Option("--with-olah", help="Also install the Hugging Face mirror olah into its own venv.")
    ] = False,
    with_node: Annotated[
        bool,
        typer.Option("--with-node", help="Also build the kubelet, controller manager, scheduler and the agent image."),
    ] = False,
) -> None:
    """Build (or find cached) kube-apiserver and etcd binaries for the pinned Kubernetes version."""
    try:
        cp.build(force=force, echo=_echo)
        if with_helm:
            cp.build_helm(echo=_echo)
        if with_emulators:
            fakegcs.build_fake_gcs(echo=_echo)
            azurite.ensure_azurite(echo=_echo)
        if with_olah:
            olah.ensure_olah(olah.default_venv_dir())
        if with_node:
            realnode.build(echo=_echo)
            agent_image.build_agent_image(echo=_echo)
    except (cp.ControlPlaneError, azurite.AzuriteError, olah.OlahError, agent_image.ImageError) as exc:
        raise _fail(exc) from None


@app.command("image")
def image_cmd() -> None:
    """Build the agent image from Dockerfile on a locally bootstrapped base; print the OCI archive and ref."""
    try:
        built = agent_image.build_agent_image(echo=_echo)
    except agent_image.ImageError as exc:
        raise _fail(exc) from None
    typer.echo(f"{built.archive} {built.ref}")
