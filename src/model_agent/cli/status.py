"""``model-agent status``: the node's view of every model, from the running agent's ``/status``.

One row per model: kind, namespace/name, node label, ConfigMap entry status (and reason), manifest check,
size, revision, last verification, download progress, where the bytes came from (origin, peers, a shared root);
then the delete breaker and the trash. ``--output
json`` prints the raw document for scripts. Exit 1 when the agent cannot be reached.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table


def _fmt_bytes(n: int | None) -> str:
    if not n:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def bytes_from(sources: dict[str, Any] | None) -> str:
    """Where a model's bytes came from, as shares of the counted bytes: ``peer 97% origin 3%``; ``-`` unknown."""
    if not sources:
        return "-"
    named = [
        ("peer", sources.get("peer")),
        ("origin", sources.get("origin")),
        ("shared root", sources.get("sharedRoot")),
    ]
    counts = [(name, n) for name, n in named if isinstance(n, int) and n > 0]
    total = sum(n for _, n in counts)
    if not total:
        return "-"
    return " ".join(f"{name} {round(100 * n / total)}%" for name, n in sorted(counts, key=lambda c: -c[1]))


def render(doc: dict[str, Any], console: Console) -> None:
    """Print the ``/status`` document as the operator's tables (models, then breaker and trash)."""
    table = Table(title=f"models on node {doc.get('node')}")
    for col in ("kind", "model", "label", "entry", "manifest", "size", "revision", "verified", "progress", "from"):
        table.add_column(col)
    for m in doc.get("models", []):
        man = m.get("manifest") or {}
        prog = m.get("progress")
        check = man.get("check")
        verified = man.get("verifiedAt")
        table.add_row(
            m["kind"],
            f"{m['namespace']}/{m['name']}" if m["namespace"] else m["name"],
            m.get("label") or "-",
            (m.get("entry") or "-") + (f" ({m['reason']})" if m.get("reason") else ""),
            "-" if not man else ("ok" if check == "ok" else "damaged: " + "; ".join(check or [])),
            _fmt_bytes(man.get("bytes")),
            (man.get("revision") or "-")[:12],
            dt.datetime.fromtimestamp(verified, dt.UTC).strftime("%m-%d %H:%M") if verified else "-",
            "-"
            if not prog
            else f"{prog['phase']} {_fmt_bytes(prog['completedBytes'])}/{_fmt_bytes(prog['totalBytes'])}",
            bytes_from(m.get("bytesBySource")),
        )
    console.print(table)
    breaker = doc.get("breaker") or {}
    state = "[red]OPEN[/red] - removals held" if breaker.get("open") else "closed"
    console.print(
        f"delete breaker: {state}; pending removals: {len(breaker.get('pending', []))}; "
        f"trips: {breaker.get('trips', 0)}"
    )
    console.print(f"trash: {len(doc.get('trash', []))} entries (see `model-agent trash list`)")
    for path in doc.get("unmanaged", []):
        console.print(f"[yellow]unmanaged directory (no manifest, left alone): {path}[/yellow]")


def status(
    port: Annotated[int, typer.Option(help="The agent's --port.")] = 8080,
    host: Annotated[str, typer.Option(help="Where the agent listens.")] = "127.0.0.1",
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Show every model on this node: label, entry, manifest check, size, revision, progress, bytes' origin."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=10) as resp:
            doc = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        typer.echo(f"error: cannot reach the agent on {host}:{port} ({exc}); is `model-agent run` running?", err=True)
        raise typer.Exit(code=1) from None
    if output == "json":
        typer.echo(json.dumps(doc, indent=2))
        return
    render(doc, Console())
