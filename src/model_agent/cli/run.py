"""``model-agent run``: the node agent itself (what the DaemonSet runs).

Flags are OME's (same names and defaults) plus this project's safety knobs; each also reads
``MODEL_AGENT_<NAME>`` from the environment. SIGTERM/SIGINT stop it in order within a few seconds; partial
downloads are kept for resume. Exit codes: 0 after a clean stop, 1 when start-up failed (logged with its
traceback), 2 for bad configuration.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer
from pydantic import ValidationError

from model_agent.agent.ignored_flags import warn_ignored
from model_agent.agent.runtime import Agent
from model_agent.agent.settings import Settings
from model_agent.kube.client import KubeClient
from model_agent.local.layout import Layout
from model_agent.ops import logging as agent_logging
from model_agent.ops.http import HealthServer, HealthSources
from model_agent.sources import egress

log = structlog.get_logger(__name__)

Opt = typer.Option


def run(
    models_root_dir: Annotated[
        Path | None, Opt(help="Host directory holding the models (OME default /mnt/models).")
    ] = None,
    allowed_root: Annotated[
        list[Path] | None, Opt(help="Another directory model paths may live in (repeatable).")
    ] = None,
    state_dir: Annotated[
        Path | None,
        Opt(help="Writable directory for the agent's records (default <root>/.model-agent); root may be read-only."),
    ] = None,
    node_name: Annotated[str | None, Opt(help="This node's name; NODE_NAME wins when set (as in OME).")] = None,
    namespace: Annotated[str | None, Opt(help="Namespace of the per-node ConfigMap (default ome).")] = None,
    port: Annotated[int | None, Opt(help="Port for /metrics, /healthz, /livez, /readyz (default 8080).")] = None,
    num_download_worker: Annotated[int | None, Opt(help="Downloads running at once (default 5).")] = None,
    download_retry: Annotated[int | None, Opt(help="Whole-model attempts for object storage (default 3).")] = None,
    node_label_retry: Annotated[int | None, Opt(help="Attempts per node-label write (default 5).")] = None,
    concurrency: Annotated[int | None, Opt(help="Files fetched in parallel within one model (default 4).")] = None,
    multipart_concurrency: Annotated[
        int | None, Opt(help="Ranged parts in flight, shared by the node's large files (default: engine's, 8).")
    ] = None,
    multipart_part_size: Annotated[
        str | None, Opt(help="Bytes per ranged part, e.g. '16Mi' (default: the engine's, 16Mi).")
    ] = None,
    log_level: Annotated[str | None, Opt(help="debug, info, warning or error (env LOG_LEVEL).")] = None,
    disk_reserve: Annotated[
        str | None, Opt(help="Free space kept beyond downloads: '10%' (default) or a size.")
    ] = None,
    kubeconfig: Annotated[Path | None, Opt(help="Kubeconfig file (default: in-cluster, then KUBECONFIG).")] = None,
    download_timeout: Annotated[
        float | None, Opt(help="Longest transfer of one model, seconds; queueing is free (default 0: none).")
    ] = None,
    download_min_rate: Annotated[
        float | None, Opt(help="Bytes/s a transfer must move over the window, else it fails (default 10240; 0: off).")
    ] = None,
    download_min_rate_window: Annotated[
        float | None, Opt(help="Window of --download-min-rate, seconds (default 300).")
    ] = None,
    confirm_timeout: Annotated[float | None, Opt(help="Deadline of a confirmation read, seconds (default 10).")] = None,
    trash_grace: Annotated[float | None, Opt(help="Seconds quarantined weights are kept (default 3600).")] = None,
    delete_breaker_ratio: Annotated[
        float | None, Opt(help="Share of models whose removal trips the breaker (0.5).")
    ] = None,
    delete_breaker_min: Annotated[int | None, Opt(help="Minimum removals that trip the breaker (3).")] = None,
    delete_breaker_window: Annotated[float | None, Opt(help="Breaker window, seconds (600).")] = None,
    delete_settle: Annotated[float | None, Opt(help="Seconds a confirmed removal waits before acting (5).")] = None,
    resync_interval: Annotated[float | None, Opt(help="Seconds between full drift passes (300).")] = None,
    verify_interval: Annotated[float | None, Opt(help="Seconds between full re-hash passes (86400).")] = None,
    verify_rate: Annotated[float | None, Opt(help="Re-hash read limit, bytes/s (200e6; 0: unlimited).")] = None,
    workers: Annotated[int | None, Opt(help="Reconcile workers (100; they mostly wait on batched writes).")] = None,
    startup_jitter: Annotated[float | None, Opt(help="Max start-up delay, spread by node name (0).")] = None,
    confirm_batch_threshold: Annotated[
        int | None, Opt(help="Pending candidates of a kind above which one LIST confirms them all (3; -1: never).")
    ] = None,
    confirm_debounce: Annotated[
        float | None, Opt(help="Seconds removal candidates are gathered before one confirmation read (1.5).")
    ] = None,
    api_qps: Annotated[float | None, Opt(help="Client-side API request rate limit (5; 0: none).")] = None,
    api_burst: Annotated[int | None, Opt(help="Client-side API burst (10).")] = None,
    max_concurrent_origin_fetches: Annotated[
        int | None, Opt(help="Nodes fetching the same model at once, fleet-wide, via Leases (0: no limit).")
    ] = None,
    origin_lease_seconds: Annotated[int | None, Opt(help="Duration of an origin slot Lease (30).")] = None,
    shared_root: Annotated[
        bool | None, Opt(help="The models root is shared by many nodes (also detected by node markers).")
    ] = None,
    trusted_namespace: Annotated[
        list[str] | None,
        Opt(help="Namespace whose BaseModels may use the node's identity and HF_TOKEN, any endpoint (repeatable)."),
    ] = None,
    tenant_endpoint_allow: Annotated[
        list[str] | None,
        Opt(help="Endpoint tenant BaseModels may name, scheme://host[:port], '*' for labels (repeatable)."),
    ] = None,
    cluster_cidr: Annotated[
        list[str] | None, Opt(help="Pod/service/node range tenant models may never connect to (repeatable).")
    ] = None,
    tenant_address_allow: Annotated[
        list[str] | None, Opt(help="Range exempt from the tenant address rules, never metadata (repeatable).")
    ] = None,
    tenant_local_allow: Annotated[
        list[str] | None,
        Opt(help="Directory besides the roots where tenant BaseModels' local:// paths may lie (repeatable)."),
    ] = None,
    max_failed_per_namespace: Annotated[
        int | None, Opt(help="Failed models of one namespace shown (entry + label) on this node (50; 0: no cap).")
    ] = None,
    peer_enabled: Annotated[
        bool | None, Opt(help="Serve Ready files to other nodes and fetch from them first (default off).")
    ] = None,
    peer_port: Annotated[int | None, Opt(help="Port of the peer server (default 8090).")] = None,
    peer_bind_address: Annotated[str | None, Opt(help="Address the peer server listens on (0.0.0.0).")] = None,
    peer_advertise_address: Annotated[
        str | None, Opt(help="host:port other nodes reach this one at (default POD_IP and --peer-port).")
    ] = None,
    peer_token_file: Annotated[
        str | None, Opt(help="Projected ServiceAccount token for the peer audience, re-read when rotated.")
    ] = None,
    peer_audience: Annotated[str | None, Opt(help="Token audience peers must present (model-agent-peer).")] = None,
    peer_allowed_username: Annotated[
        str | None, Opt(help="Identity peers must be (default system:serviceaccount:<namespace>:model-agent).")
    ] = None,
    peer_upload_rate: Annotated[
        float | None, Opt(help="Bytes/s this node serves to all peers together (0: no cap).")
    ] = None,
    peer_max_per_peer: Annotated[int | None, Opt(help="Requests in flight per peer; more get 429 (32).")] = None,
    peer_ban_seconds: Annotated[
        float | None, Opt(help="How long a peer whose bytes failed verification is not asked (600).")
    ] = None,
) -> None:
    """Run the node agent: watch models, fetch weights, label the Node, keep the ConfigMap."""
    given: dict[str, Any] = {
        "models_root_dir": models_root_dir,
        "allowed_roots": allowed_root,
        "state_dir": state_dir,
        "namespace": namespace,
        "port": port,
        "num_download_worker": num_download_worker,
        "download_retry": download_retry,
        "node_label_retry": node_label_retry,
        "concurrency": concurrency,
        "multipart_concurrency": multipart_concurrency,
        "multipart_part_size": multipart_part_size,
        "kubeconfig": kubeconfig,
        "disk_reserve": disk_reserve,
        "download_timeout_s": download_timeout,
        "download_min_rate": download_min_rate,
        "download_min_rate_window_s": download_min_rate_window,
        "confirm_timeout_s": confirm_timeout,
        "trash_grace_s": trash_grace,
        "delete_breaker_ratio": delete_breaker_ratio,
        "delete_breaker_min": delete_breaker_min,
        "delete_breaker_window_s": delete_breaker_window,
        "delete_settle_s": delete_settle,
        "resync_interval_s": resync_interval,
        "verify_interval_s": verify_interval,
        "verify_rate_bytes_s": verify_rate,
        "workers": workers,
        "startup_jitter_s": startup_jitter,
        "confirm_batch_threshold": confirm_batch_threshold,
        "confirm_debounce_s": confirm_debounce,
        "api_qps": api_qps,
        "api_burst": api_burst,
        "max_concurrent_origin_fetches": max_concurrent_origin_fetches,
        "origin_lease_s": origin_lease_seconds,
        "shared_root": shared_root,
        "trusted_namespaces": trusted_namespace,
        "tenant_endpoint_allow": tenant_endpoint_allow,
        "cluster_cidrs": cluster_cidr,
        "tenant_address_allow": tenant_address_allow,
        "max_failed_per_namespace": max_failed_per_namespace,
        "tenant_local_allow": tenant_local_allow,
        "peer_enabled": peer_enabled,
        "peer_port": peer_port,
        "peer_bind_address": peer_bind_address,
        "peer_advertise_address": peer_advertise_address,
        "peer_token_file": peer_token_file,
        "peer_audience": peer_audience,
        "peer_allowed_username": peer_allowed_username,
        "peer_upload_rate": peer_upload_rate,
        "peer_max_per_peer": peer_max_per_peer,
        "peer_ban_seconds": peer_ban_seconds,
    }
    kwargs = {k: v for k, v in given.items() if v is not None}
    if not os.environ.get("NODE_NAME") and node_name:
        kwargs["NODE_NAME"] = node_name
    if log_level:
        kwargs["LOG_LEVEL"] = log_level
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
