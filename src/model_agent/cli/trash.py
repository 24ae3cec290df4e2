"""``model-agent trash``: the node's quarantine, for operators.

``list`` shows what is held and when it will be purged; ``restore ID`` puts a quarantined directory back
where it was (the agent then leaves it alone as an unmanaged directory unless a model claims that source and
path again); ``purge ID|--expired|--all`` deletes for real; ``resume`` releases a tripped delete breaker
(the running agent notices within a second). These commands act on the local disk only and work while the
agent is stopped.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from model_agent.local.layout import Layout, resume_file
from model_agent.local.trash import Trash, TrashEntry

app = typer.Typer(help="Inspect and manage quarantined weights and the delete breaker.", no_args_is_help=True)

Root = Annotated[Path, typer.Option("--models-root-dir", envvar="MODEL_AGENT_MODELS_ROOT_DIR", help="Models root.")]
Grace = Annotated[float, typer.Option("--trash-grace", help="Grace period in seconds (for 'purge in').")]


def _trash(root: Path) -> Trash:
    return Trash(Layout(root))


def _find(trash: Trash, entry_id: str) -> TrashEntry:
    for entry in trash.entries():
        if entry.id == entry_id:
            return entry
    typer.echo(f"error: no trash entry {entry_id!r} (see `model-agent trash list`)", err=True)
    raise typer.Exit(code=2)


@app.command("list")
def list_cmd(
    root: Root = Path("/mnt/models"),
    grace: Grace = 3600.0,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Show quarantined models: id, model, source, size, age, time left before purge."""
    entries = list(_trash(root).entries())
    now = time.time()
    if output == "json":
        typer.echo(
            json.dumps([e.to_json() | {"purgeInSeconds": max(0, grace - (now - e.quarantined_at))} for e in entries])
        )
        return
    table = Table(title=f"trash under {root}")
    for col in ("id", "model", "source", "bytes", "quarantined", "purge in", "reason"):
        table.add_column(col)
    for e in entries:
        left = max(0.0, grace - (now - e.quarantined_at))
        table.add_row(
            e.id,
            e.manifest.key,
            e.manifest.storage_uri,
            str(e.manifest.total_bytes),
            dt.datetime.fromtimestamp(e.quarantined_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
            f"{left:.0f}s",
            e.reason,
        )
    Console().print(table)


@app.command()
def restore(entry_id: str, root: Root = Path("/mnt/models")) -> None:
    """Move a quarantined directory back to its original path (refused if that path exists)."""
    trash = _trash(root)
    entry = _find(trash, entry_id)
    dest = Path(entry.manifest.dest)
    if dest.exists():
        typer.echo(f"error: {dest} exists; move it away first", err=True)
        raise typer.Exit(code=2)
    trash.restore(entry)
    typer.echo(f"restored {entry.manifest.key} to {dest}")


@app.command()
def purge(
    entry_id: Annotated[str | None, typer.Argument(help="Entry to purge.")] = None,
    root: Root = Path("/mnt/models"),
    expired: Annotated[bool, typer.Option("--expired", help="Purge entries older than --trash-grace.")] = False,
    all_: Annotated[bool, typer.Option("--all", help="Purge everything in the trash.")] = False,
    grace: Grace = 3600.0,
) -> None:
    """Delete quarantined weights for real."""
    trash = _trash(root)
    if entry_id:
        entry = _find(trash, entry_id)
        trash.purge(entry)
        typer.echo(f"purged {entry.id}")
    elif expired or all_:
        purged = trash.purge_expired(0.0 if all_ else grace)
        typer.echo(f"purged {len(purged)} entries")
    else:
        typer.echo("error: give an entry id, --expired or --all", err=True)
        raise typer.Exit(code=2)


@app.command()
def resume(
    root: Root = Path("/mnt/models"),
    node: Annotated[
        str, typer.Option("--node", envvar="NODE_NAME", help="The node whose breaker to release (default: NODE_NAME).")
    ] = "",
    all_nodes: Annotated[
        bool, typer.Option("--all", help="Release the breaker of every node using this models root.")
    ] = False,
) -> None:
    """Release a tripped delete breaker: removals confirmed within the next window may proceed.

    One node's (``--node``, or the NODE_NAME of the agent's pod) unless ``--all``: on a shared root every node
    reads the same private area, and a resume meant for one node must not lift the others' holds.
    """
    if not node and not all_nodes:
        typer.echo("error: name the node (--node or NODE_NAME), or --all for every node of this root", err=True)
        raise typer.Exit(code=2)
    layout = Layout(root)
    layout.primary.private.mkdir(parents=True, exist_ok=True)
    marker = resume_file(layout.primary.private, None if all_nodes else node)
    marker.write_text(str(time.time()))
    scope = "every node of this root" if all_nodes else f"node {node}"
    typer.echo(f"breaker resume requested for {scope} ({marker}); the agent acts on it within a second")
