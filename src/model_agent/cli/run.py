"""``model-agent run``: the node agent itself (what the DaemonSet runs).

Flags are OME's (same names and defaults) plus this project's safety knobs; each also reads
``MODEL_AGENT_<FIELD>`` from the environment. They are not written here: the command's options are generated
from the Settings fields that carry a ``Flag`` (``agent/settings.py``, ``agent/flags.py``), so a new field
marked as a flag is a new option. SIGTERM/SIGINT stop it in order within a few seconds; partial
downloads are kept for resume. Exit codes: 0 after a clean stop, 1 when start-up failed (logged with its
traceback), 2 for bad configuration.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sys
from typing import Annotated, Any, cast

import structlog
import typer
from pydantic import ValidationError

from model_agent.agent.flags import RunFlag, run_flags
from model_agent.agent.ignored_flags import warn_ignored
from model_agent.agent.runtime import Agent
from model_agent.agent.settings import Settings
from model_agent.kube.client import KubeClient
from model_agent.local.layout import Layout
from model_agent.ops import logging as agent_logging
from model_agent.ops.http import HealthServer, HealthSources
from model_agent.sources import egress

log = structlog.get_logger(__name__)

RUN_FLAGS = run_flags()  # the Settings fields that are flags, in field order


def flag_option(flag: RunFlag) -> inspect.Parameter:
    """One typer option: unset is None, so the environment variable or the field's default decides."""
    # a switch has its --no- form (a DaemonSet can turn off what the environment turned on)
    declared = f"{flag.option}/--no-{flag.option[2:]}" if flag.value_type is bool else flag.option
    option_type = cast(Any, Annotated)[flag.value_type | None, typer.Option(declared, help=flag.help)]
    return inspect.Parameter(flag.field, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=option_type)


def settings_input(given: dict[str, Any]) -> dict[str, Any]:
    """The keywords for Settings from the flags given (keyed by field); flags not given are left out."""
    values: dict[str, Any] = {}
    for flag in RUN_FLAGS:
        value = given.get(flag.field)
        if value is None:
            continue
        # OME's special cases, the aliased fields: an empty --node-name or --log-level leaves NODE_NAME or
        # LOG_LEVEL in charge, and NODE_NAME (downward API) wins over --node-name.
        if flag.key != flag.field and not value:
            continue
        if flag.env_wins and os.environ.get(flag.env):
            continue
        values[flag.key] = value
    return values


def run(**given: Any) -> None:
    """Run the node agent: watch models, fetch weights, label the Node, keep the ConfigMap."""
    kwargs = settings_input(given)
    try:
        settings = Settings(**kwargs)
        # nested roots, a --state-dir inside a root: refused here
        Layout(settings.models_root_dir, list(settings.allowed_roots), settings.state_dir)
        agent_logging.configure(settings.log_level)
        warn_ignored(settings)  # OME flags accepted for compatibility that have no effect here
        egress.configure(settings.tenancy_policy())  # before any fetch: the rules every source applies
    except (ValidationError, ValueError) as exc:
        typer.echo(f"error: invalid configuration: {exc}", err=True)
        raise typer.Exit(code=2) from None
    profile_to = os.environ.get("MODEL_AGENT_PROFILE")  # benchmarks: write cProfile stats here on exit
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        code = profiler.runcall(asyncio.run, _main(settings))
        profiler.dump_stats(f"{profile_to}.{os.getpid()}")
    else:
        code = asyncio.run(_main(settings))
    sys.stdout.flush()
    # Worker threads may still be writing a file into staging; it is resumed on restart. Do not wait.
    os._exit(code)


# typer builds the command from the signature: one option per flag, generated from the Settings fields.
run.__signature__ = inspect.Signature([flag_option(flag) for flag in RUN_FLAGS])  # type: ignore[attr-defined]


async def _main(settings: Settings) -> int:
    client = await KubeClient.connect(settings.kubeconfig)
    agent = Agent(settings, client)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    health = HealthServer(
        HealthSources(
            client=client,
            metrics=agent.metrics,
            reflectors=agent.reflectors,
            roots=[str(r.path) for r in agent.layout.roots],
            records=[str(r.manifests) for r in agent.layout.roots],
            loop_tick=lambda: agent.last_loop_tick,
            synced=agent.synced,
            status=agent.status_snapshot,
            verify=agent.verify,
            verify_running=agent.verify_running,
            rbac_problem=agent.rbac_problem,
            background_problem=agent.supervisor.problem,
        ),
        "0.0.0.0",
        settings.port,
    )
    await health.start()
    starting = asyncio.create_task(agent.start())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopper}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if not starting.done():
        starting.cancel()
    elif starting.exception() is not None:
        # Nothing runs without a start: say why, stop in order, and exit non-zero so the pod restarts.
        log.error("agent start failed", exc_info=starting.exception())
        code = 1
    else:
        await stop.wait()
    log.info("stopping")
    await agent.stop()
    await health.stop()
    await client.close()
    log.info("stopped")
    return code
