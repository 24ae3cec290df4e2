"""The ``model-agent`` command line: one typer app with a sub-app per area.

Exit codes: 0 success; 1 the thing asked about is not in the wanted state (e.g. ``dev status`` when
nothing runs); 2 a usage or environment error with a one-line message on stderr.
"""

from __future__ import annotations

import typer

from model_agent.cli import preflight, run, status, trash, verify

app = typer.Typer(
    help="model-agent keeps a node's model weights, Node labels and ConfigMap in agreement with OME models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("run")(run.run)
app.command("status")(status.status)
app.command("verify")(verify.verify)
app.command("preflight")(preflight.preflight)
app.add_typer(trash.app, name="trash")


def main() -> None:  # pragma: no cover - console entry
    """The console entry point (``model-agent``)."""
    app()
