"""``model-agent preflight``: before replacing OME's Go agent, list the models this agent would show differently.

Run it with the flags the DaemonSet will run (the same options as ``model-agent run``; ``NODE_NAME`` is not
needed) and a kubeconfig that may list BaseModels and ClusterBaseModels. One row per model that would change
state, with the reason this agent would give and the setting that keeps the model as OME's agent served it
(:mod:`model_agent.agent.preflight`). ``--output json`` prints the rows for scripts. Exit codes: 0 when no model
would change, 1 when some would, 2 for bad configuration or an unreachable API server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from model_agent.agent.preflight import Change, judge
from model_agent.agent.settings import Settings
from model_agent.cli.run import RUN_FLAGS, flag_option, settings_input
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.kubeconfig import KubeconfigError
from model_agent.kube.resources import BASEMODELS, CLUSTERBASEMODELS, Resource
from model_agent.local.layout import Layout
from model_agent.model.resources import InvalidModel, ModelObject, ModelRef

PAGE = 500


def preflight(**given: Any) -> None:
    """List the models this agent would show differently from OME's Go agent, with the setting that keeps each."""
    output = given.pop("output", None) or "table"
    kwargs = settings_input(given)
    kwargs.setdefault("node_name", "preflight")  # judged for the cluster, not for one node
    try:
        settings = Settings(**kwargs)
        layout = Layout(settings.models_root_dir, list(settings.allowed_roots), settings.state_dir)
        policy = settings.tenancy_policy()
    except (ValidationError, ValueError) as exc:
        typer.echo(f"error: invalid configuration: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        models = asyncio.run(_list_models(settings.kubeconfig))
    except (ApiError, ApiUnavailable, KubeconfigError) as exc:
        typer.echo(f"error: listing the models failed: {exc}", err=True)
        raise typer.Exit(code=2) from None
    changes = [c for obj in models if (c := judge(obj, layout, policy, tuple(settings.tenant_local_allow)))]
    if output == "json":
        typer.echo(json.dumps([dataclasses.asdict(c) for c in changes], indent=2))
    else:
        _print_table(changes, len(models))
    raise typer.Exit(code=1 if changes else 0)


preflight.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *(flag_option(flag) for flag in RUN_FLAGS),
        inspect.Parameter(
            "output",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[str | None, typer.Option("--output", "-o", help="table (default) or json")],
        ),
    ]
)


async def _list_models(kubeconfig: Path | None) -> list[ModelObject]:
    async with await KubeClient.connect(kubeconfig) as client:
        found: list[ModelObject] = []
        for resource in (CLUSTERBASEMODELS, BASEMODELS):
            found += await _list(client, resource)
        return found


async def _list(client: KubeClient, resource: Resource) -> list[ModelObject]:
    """Every object of ``resource`` in all namespaces, page by page; objects that do not parse are left out (the
    agent shows them ``Failed: InvalidModel`` whichever agent runs)."""
    out: list[ModelObject] = []
    cont = ""
    while True:
        query: dict[str, str | int] = {"limit": PAGE} | ({"continue": cont} if cont else {})
        page = await client.request("GET", resource.path(), query=query)
        for item in page.get("items") or []:
            item.setdefault("kind", resource.kind)
            try:
                out.append(ModelObject.from_dict(ModelRef.from_object(item).kind, item))
            except (ValueError, InvalidModel):
                continue
        cont = str((page.get("metadata") or {}).get("continue") or "")
        if not cont:
            return out


def _print_table(changes: list[Change], total: int) -> None:
    console = Console(width=200)
    if not changes:
        console.print(f"{total} models checked: none would change state on switching to this agent.")
        return
    table = Table(title=f"{len(changes)} of {total} models would change state on switching to this agent")
    for column in ("model", "would be", "reason", "setting that keeps it", "detail"):
        table.add_column(column, overflow="fold")
    for c in changes:
        table.add_row(c.key, c.state, c.reason, c.setting, c.message)
    console.print(table)
