"""Agent configuration: OME's flags and environment, plus this project's safety knobs, each defined once here.

Values come from command-line flags (``model-agent run --help``); every flag also reads an environment
variable (``MODEL_AGENT_<FIELD>``, e.g. ``MODEL_AGENT_DOWNLOAD_TIMEOUT_S`` for ``--download-timeout``), which
fixes OME's "env is ignored except LOG_LEVEL" quirk. ``NODE_NAME`` is required (downward API
``spec.nodeName``). The tenancy lists (``--trusted-namespace``, ``--tenant-endpoint-allow``, ``--cluster-cidr``,
``--tenant-address-allow``, ``--tenant-local-allow``, all repeatable) read their environment variables as
comma-separated values (``MODEL_AGENT_TRUSTED_NAMESPACES=team-a,team-b``) or JSON.

A field is a flag when it carries a :class:`Flag` (its name, help and default in words): ``cli/run.py`` builds
the command's options from them and ``agent/flags.py`` renders the README's table, so nothing else lists flags.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from model_agent.agent.download_limits import DownloadLimits
from model_agent.local.capacity import parse_size
from model_agent.model.go_duration import parse_go_duration
from model_agent.peers import DEFAULT_AUDIENCE as DEFAULT_PEER_AUDIENCE
from model_agent.peers import DEFAULT_PORT as DEFAULT_PEER_PORT
from model_agent.peers import PeerConfig
from model_agent.sources.egress import TenancyPolicy
from model_agent.transfer import RangedConfig

# A list setting whose environment variable is comma-separated text (or a JSON list), not JSON only.
TextList = Annotated[list[str], NoDecode]


@dataclass(frozen=True)
class Flag:
    """Marks a Settings field as a flag of ``model-agent run``: the one place its name, help and default text live.

    ``cli/run.py`` builds the command's options from these, and ``agent/flags.py`` the README's flags table, so a
    field with a ``Flag`` is a flag everywhere at once. ``help`` is one sentence without the default (that is
    appended from the field); ``name`` is the flag without ``--`` when it is not the field's name with dashes;
    ``default`` says the default in words when the field's value does not (``""`` meaning "the engine's");
    ``more`` continues ``help`` in the README only; ``env_wins``: the environment variable beats the flag.
    """

    help: str
    name: str = ""
    default: str = ""
    more: str = ""
    env_wins: bool = False


class Settings(BaseSettings):
    """Every setting of the agent; the fields marked with a :class:`Flag` are ``model-agent run``'s flags."""

    model_config = SettingsConfigDict(env_prefix="MODEL_AGENT_", frozen=True, extra="ignore")

    node_name: Annotated[
        str,
        Flag(
            "This node's name; NODE_NAME (the downward API's spec.nodeName) wins when set, as in OME.",
            default="none, NODE_NAME is required",
            env_wins=True,
        ),
    ] = Field(default="", validation_alias="NODE_NAME")
    models_root_dir: Annotated[Path, Flag("Host directory holding the models; also the first allowed root.")] = Path(
        "/mnt/models"
    )
    allowed_roots: Annotated[
        list[Path], Flag("Another directory model paths may live in (repeatable).", name="allowed-root")
    ] = Field(default_factory=list)
    state_dir: Annotated[
        Path | None,
        Flag(
            "Writable directory for the agent's records (manifests); with it the models root may be read-only.",
            default="<models-root>/.model-agent",
            more="for pre-provisioned `local://` models (fetches into a read-only root fail `PathRefused`)",
        ),
    ] = None
    namespace: Annotated[
        str,
        Flag("Namespace of the per-node ConfigMap, the Leases and resolve records, ClusterBaseModel Secrets."),
    ] = "ome"
    port: Annotated[int, Flag("Port for /metrics, /healthz, /livez, /readyz and /status.")] = 8080
    num_download_worker: Annotated[int, Flag("Model downloads running at once.")] = 5
    download_retry: Annotated[int, Flag("OME's whole-model attempts for object storage.")] = 3
    node_label_retry: Annotated[int, Flag("Attempts per batched node-label write.")] = 5
    concurrency: Annotated[int, Flag("OME's objects fetched in parallel within one model.")] = 4
    multipart_concurrency: Annotated[
        int,
        Flag("Ranged parts in flight, shared by the node's large files (0: the engine's).", default="the engine's, 8"),
    ] = 0
    multipart_part_size: Annotated[
        str,
        Flag(
            "Bytes per ranged part, e.g. 16Mi.",
            default="the engine's, 16Mi",
            more="a kill re-fetches at most parts in flight x part size",
        ),
    ] = ""
    log_level: Annotated[
        str,
        Flag("debug, info, warning or error.", more="JSON lines on stdout, secrets redacted"),
    ] = Field(default="info", validation_alias="LOG_LEVEL")
    kubeconfig: Annotated[Path | None, Flag("Kubeconfig file.", default="in-cluster, then KUBECONFIG")] = None
    hf_endpoint: str | None = Field(default=None, validation_alias="HF_ENDPOINT")
    disk_reserve: Annotated[
        str,
        Flag(
            "Free space kept beyond every download: a share of the filesystem or a size.",
            more="otherwise `Failed: InsufficientDisk`",
        ),
    ] = "10%"
    download_timeout_s: Annotated[
        float,
        Flag(
            "Longest transfer of one model, seconds; time queued for a worker or an origin slot is free (0: none).",
            name="download-timeout",
            more="then `Failed: DownloadTimeout`, retried with backoff, partial files kept",
        ),
    ] = 0.0
    download_min_rate: Annotated[
        float,
        Flag(
            "Bytes/s a transfer must move over the window, else it fails (0: off).",
            more="`Failed: DownloadTooSlow` (a mirror that holds a request open or trickles a body never trips a "
            "per-read timeout)",
        ),
    ] = 10240.0
    download_min_rate_window_s: Annotated[
        float, Flag("Window of --download-min-rate, seconds.", name="download-min-rate-window")
    ] = 300.0

    # safety
    confirm_timeout_s: Annotated[float, Flag("Deadline of a confirmation read, seconds.", name="confirm-timeout")] = (
        10.0
    )
    trash_grace_s: Annotated[float, Flag("Seconds quarantined weights are kept.", name="trash-grace")] = 3600.0
    delete_breaker_ratio: Annotated[float, Flag("Share of the models whose removal trips the delete breaker.")] = 0.5
    delete_breaker_min: Annotated[int, Flag("Fewest removals that trip the delete breaker.")] = 3
    delete_breaker_window_s: Annotated[
        float, Flag("Window of the delete breaker, seconds.", name="delete-breaker-window")
    ] = 600.0
    delete_settle_s: Annotated[
        float, Flag("Seconds a confirmed removal waits before acting.", name="delete-settle")
    ] = 5.0
    confirm_batch_threshold: Annotated[
        int,
        Flag(
            "Pending removal candidates of a kind above which one consistent LIST confirms them all instead of a GET "
            "each (-1: never).",
        ),
    ] = 3
    confirm_debounce_s: Annotated[
        float,
        Flag(
            "Seconds removal candidates are gathered (plus up to 1 s jitter) before one confirmation read.",
            name="confirm-debounce",
        ),
    ] = 1.5

    # tenancy (sources/egress.py): who gets the node's identity, where tenant models may connect
    trusted_namespaces: Annotated[
        TextList,
        Flag(
            "Namespace whose BaseModels may use the node's identity and the platform HF_TOKEN (repeatable).",
            name="trusted-namespace",
        ),
    ] = Field(default_factory=list)
    tenant_endpoint_allow: Annotated[
        TextList,
        Flag(
            "Endpoint scheme://host[:port] a tenant's parameters.endpoint may name, '*' for labels (repeatable).",
            default="each store's public endpoints",
        ),
    ] = Field(default_factory=list)
    cluster_cidrs: Annotated[
        TextList,
        Flag("Pod, service or node range tenant models may never connect to (repeatable).", name="cluster-cidr"),
    ] = Field(default_factory=list)
    tenant_address_allow: Annotated[
        TextList, Flag("Range exempt from the tenant address rules, never the metadata addresses (repeatable).")
    ] = Field(default_factory=list)
    tenant_local_allow: Annotated[
        TextList,
        Flag(
            "Directory besides the models roots where a tenant BaseModel's local:// path may lie (repeatable).",
            more="symlinks out of them are refused",
        ),
    ] = Field(default_factory=list)
    max_failed_per_namespace: Annotated[
        int,
        Flag(
            "Failing BaseModels of one namespace shown (ConfigMap entry and Node label) per node (0: no cap).",
            more="the rest get their Warning Event only (counted in `model_agent_failed_entries_refused_total`)",
        ),
    ] = 50
    max_models_per_namespace: Annotated[
        int,
        Flag(
            "BaseModels of one namespace shown Ready or Updating per node (0: no cap).",
            more=(
                "the rest are not fetched there and show `Failed: ModelQuotaExceeded` (counted in "
                "`model_agent_models_refused_total`)"
            ),
        ),
    ] = 100

    # API load
    api_qps: Annotated[float, Flag("Client-side API request rate, a token bucket (0: none).")] = 5.0
    api_burst: Annotated[int, Flag("Client-side API burst.")] = 10

    # fleet-wide origin protection (0: no limit, and no cluster-wide resolve records)
    max_concurrent_origin_fetches: Annotated[
        int,
        Flag(
            "Nodes fetching the same model at once, fleet-wide, via Lease slots (0: no limit).",
            more="with a limit, also one hub resolve per model revision for the whole cluster",
        ),
    ] = 0
    origin_lease_s: Annotated[int, Flag("Duration of an origin slot Lease, seconds.", name="origin-lease-seconds")] = 30
    lease_max_hold_s: Annotated[
        float,
        Flag(
            "Longest one holder keeps one acquisition of a Lease, seconds (others take it over after).",
            name="lease-max-hold",
            more="a fetch longer than this on a shared root pauses and resumes under a new acquisition",
        ),
    ] = 21600.0
    # the models root is mounted on many nodes: one fetch for all, no node removes files others serve
    shared_root: Annotated[bool, Flag("The models root is shared by many nodes (also detected by node markers).")] = (
        False
    )

    # node-to-node distribution (model_agent.peers): off unless asked (OME's flags unchanged); the chart turns it on
    peer_enabled: Annotated[
        bool,
        Flag(
            "Serve Ready files to other nodes and fetch hf:// LFS files from them first.",
            more="verified against the hub's sha256 ([operations](docs/operations.md#peer-distribution)); the chart "
            "turns it on",
        ),
    ] = False
    peer_port: Annotated[int, Flag("Port of the peer server.")] = DEFAULT_PEER_PORT
    peer_bind_address: Annotated[str, Flag("Address the peer server listens on.")] = "0.0.0.0"
    peer_advertise_address: Annotated[
        str, Flag("host:port other nodes reach this one at.", default="POD_IP and --peer-port")
    ] = ""
    peer_token_file: Annotated[
        str,
        Flag("Projected ServiceAccount token for the peer audience, re-read when rotated.", default="none"),
    ] = ""
    peer_audience: Annotated[str, Flag("Token audience peers must present.")] = DEFAULT_PEER_AUDIENCE
    peer_allowed_username: Annotated[
        str, Flag("Identity peers must be.", default="system:serviceaccount:<namespace>:model-agent")
    ] = ""
    peer_upload_rate: Annotated[float, Flag("Bytes/s this node serves to all peers together (0: no cap).")] = 0.0
    peer_max_per_peer: Annotated[int, Flag("Requests in flight per peer; more get 429.")] = 32
    peer_ban_seconds: Annotated[float, Flag("Seconds a peer whose bytes failed verification is not asked.")] = 600.0
    peer_downstreams_per_file: Annotated[
        int, Flag("Nodes one file is served to at once; more get 429, so fleets fetch in chains (0: no cap).")
    ] = 1
    peer_relay_part_size: Annotated[
        int,
        Flag("Part size, bytes, of hf:// LFS fetches with peers on (from the origin and from peers; 0: the engine's)."),
    ] = 4 * 1024 * 1024

    # drift and load
    resync_interval_s: Annotated[
        float,
        Flag("Seconds between full drift passes (labels, entries, files by stat).", name="resync-interval"),
    ] = 300.0
    verify_interval_s: Annotated[float, Flag("Seconds between full re-hash passes.", name="verify-interval")] = 86400.0
    verify_rate_bytes_s: Annotated[
        float, Flag("Read limit of the re-hash pass, bytes/s (0: unlimited).", name="verify-rate")
    ] = 200e6
    workers: Annotated[int, Flag("Reconcile workers (they mostly wait on batched writes).")] = 100
    # OME v1.3's flags (its chart passes them): two are mapped, one does not apply here (agent/ignored_flags.py).
    model_verification_concurrency: Annotated[
        int, Flag("Models re-hashed at once by a verification pass (each at --verify-rate).")
    ] = 1
    num_high_priority_worker: Annotated[
        int, Flag("Reconcile workers reserved for models being deleted or gone (besides --workers).")
    ] = 1
    same_path_wait_timeout: Annotated[
        str, Flag("OME's wait for another model's download at the same path (a Go duration).")
    ] = "30m"
    startup_jitter_s: Annotated[
        float, Flag("Longest start-up delay, seconds, spread deterministically by node name.", name="startup-jitter")
    ] = 0.0

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not value:
            raise ValueError("NODE_NAME must be set (the Kubernetes node this agent runs on)")
        return value

    @field_validator(
        "trusted_namespaces",
        "tenant_endpoint_allow",
        "cluster_cidrs",
        "tenant_address_allow",
        "tenant_local_allow",
        mode="before",
    )
    @classmethod
    def _text_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    def peer_config(self) -> PeerConfig:
        """The peer distribution settings (``--peer-*`` flags, ``MODEL_AGENT_PEER_*`` environment)."""
        # PeerConfig's fields are the peer_* settings without their prefix; only the ban keeps its flag's word.
        setting_of = {f.name: f"peer_{f.name}" for f in dataclasses.fields(PeerConfig)} | {"ban_s": "peer_ban_seconds"}
        return PeerConfig(**{name: getattr(self, setting) for name, setting in setting_of.items()})

    def tenancy_policy(self) -> TenancyPolicy:
        """The tenancy rules from these settings; ValueError for a malformed pattern or range."""
        return TenancyPolicy.build(
            trusted_namespaces=self.trusted_namespaces,
            endpoint_allow=self.tenant_endpoint_allow,
            cluster_ranges=self.cluster_cidrs,
            address_allow=self.tenant_address_allow,
        )

    @field_validator("same_path_wait_timeout")
    @classmethod
    def _go_duration(cls, value: str) -> str:
        parse_go_duration(value)  # a value OME's agent would refuse is refused here too
        return value

    @field_validator("multipart_part_size")
    @classmethod
    def _part_size(cls, value: str) -> str:
        if value and parse_size(value) < 1:
            raise ValueError("must be at least one byte")
        return value

    @field_validator("lease_max_hold_s")
    @classmethod
    def _a_minute_or_more(cls, value: float) -> float:
        if value < 60:
            raise ValueError("must be at least 60 seconds (two Lease durations and more)")
        return value

    @field_validator("multipart_concurrency", "max_failed_per_namespace", "max_models_per_namespace")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 (the default) or more")
        return value

    def download_limits(self) -> DownloadLimits:
        """Deadlines of one model's fetch (``agent/download_limits.py``)."""
        return DownloadLimits(
            timeout_s=self.download_timeout_s,
            min_rate_bytes_s=self.download_min_rate,
            window_s=self.download_min_rate_window_s,
        )

    def ranged_config(self) -> RangedConfig:
        """The ranged download engine's tuning: its measured defaults unless a flag says otherwise."""
        engine = RangedConfig()
        return dataclasses.replace(
            engine,
            concurrency=self.multipart_concurrency or engine.concurrency,
            part_size=parse_size(self.multipart_part_size) if self.multipart_part_size else engine.part_size,
        )

    @field_validator(
        "num_download_worker",
        "workers",
        "node_label_retry",
        "download_retry",
        "model_verification_concurrency",
        "num_high_priority_worker",
    )
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value


def flag_of(field: str) -> Flag | None:
    """The :class:`Flag` of a Settings field, None when the field is no flag (read from the environment only)."""
    return next((m for m in Settings.model_fields[field].metadata if isinstance(m, Flag)), None)


def flag_name(field: str) -> str:
    """The command-line flag of a Settings field, with its dashes: ``origin_lease_s`` -> ``--origin-lease-seconds``."""
    flag = flag_of(field)
    if flag is None:
        raise KeyError(f"setting {field!r} is not a flag of model-agent run")
    return "--" + (flag.name or field.replace("_", "-"))
