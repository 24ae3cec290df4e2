"""``model-agent verify [MODEL ...] [--all]``: re-hash a model's files now.

Asks the running agent (``POST /verify`` on its port), which records damage in the manifest and fetches
the damaged files again; prints one line per model. Exit codes: 0 all intact, 1 damage found (being
repaired), 2 the agent could not be reached or the request was wrong. MODEL is ``Kind/namespace/name``
(``ClusterBaseModel//name`` for cluster models) as ``model-agent status -o json`` shows.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Annotated

import typer


def verify(
    models: Annotated[list[str] | None, typer.Argument(help="Models to verify (Kind/namespace/name).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Verify every model on this node.")] = False,
    port: Annotated[int, typer.Option(help="The agent's --port.")] = 8080,
    host: Annotated[str, typer.Option(help="Where the agent listens.")] = "127.0.0.1",
) -> None:
    """Re-hash models' files against their manifests; damaged files are fetched again."""
    if not models and not all_:
        typer.echo("error: name models to verify, or --all", err=True)
        raise typer.Exit(code=2)
    query = urllib.parse.urlencode([("model", m) for m in (models or [])])
    request = urllib.request.Request(f"http://{host}:{port}/verify?{query}", method="POST", data=b"")
    try:
        with urllib.request.urlopen(request, timeout=24 * 3600) as resp:
            report: dict[str, list[str]] = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        typer.echo(f"error: cannot reach the agent on {host}:{port} ({exc})", err=True)
        raise typer.Exit(code=2) from None
    damaged = 0
    for key, files in sorted(report.items()):
        if files:
            damaged += 1
            typer.echo(f"DAMAGED {key}: {', '.join(files)} (fetching again)")
        else:
            typer.echo(f"ok      {key}")
    if models and not report:
        typer.echo("error: no such model with local weights on this node", err=True)
        raise typer.Exit(code=2)
    raise typer.Exit(code=1 if damaged else 0)
