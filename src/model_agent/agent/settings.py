"""Agent configuration: OME's flags and environment, plus this project's safety knobs.

Values come from command-line flags (``model-agent run --help``); every flag also reads an environment
variable (``MODEL_AGENT_<FLAG>``), which fixes OME's "env is ignored except LOG_LEVEL" quirk. ``NODE_NAME``
is required (downward API ``spec.nodeName``). The tenancy lists (``--trusted-namespace``,
``--tenant-endpoint-allow``, ``--cluster-cidr``, ``--tenant-address-allow``, all repeatable) read their
environment variables as comma-separated values (``MODEL_AGENT_TRUSTED_NAMESPACES=team-a,team-b``) or JSON.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from model_agent.agent.download_limits import DownloadLimits
from model_agent.local.capacity import parse_size
from model_agent.peers import DEFAULT_AUDIENCE as DEFAULT_PEER_AUDIENCE
from model_agent.peers import DEFAULT_PORT as DEFAULT_PEER_PORT
from model_agent.peers import PeerConfig
from model_agent.sources.egress import TenancyPolicy
from model_agent.transfer import RangedConfig

# A list setting whose environment variable is comma-separated text (or a JSON list), not JSON only.
TextList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODEL_AGENT_", frozen=True, extra="ignore")

    node_name: str = Field(default="", validation_alias="NODE_NAME")
    models_root_dir: Path = Path("/mnt/models")
    allowed_roots: list[Path] = Field(default_factory=list)
    state_dir: Path | None = None  # the agent's records (manifests) if not <models-root>/.model-agent
    namespace: str = "ome"
    port: int = 8080
    num_download_worker: int = 5
    download_retry: int = 3
    node_label_retry: int = 5
    concurrency: int = 4
    disk_reserve: str = "10%"  # free space kept beyond every download: a share of the filesystem or a size
    download_timeout_s: float = 0.0  # longest transfer of one model, seconds (0: no limit); waiting is free
    download_min_rate: float = 10240.0  # bytes/s a transfer must move over download_min_rate_window_s (0: off)
    download_min_rate_window_s: float = 300.0
    multipart_concurrency: int = 0  # ranged parts in flight per node across large files (0: the engine's default)
    multipart_part_size: str = ""  # bytes per ranged part, e.g. "16Mi" ("": the engine's default)
    log_level: str = Field(default="info", validation_alias="LOG_LEVEL")
    kubeconfig: Path | None = None
    hf_endpoint: str | None = Field(default=None, validation_alias="HF_ENDPOINT")

    # safety
    confirm_timeout_s: float = 10.0
    trash_grace_s: float = 3600.0
    delete_breaker_ratio: float = 0.5
    delete_breaker_min: int = 3
    delete_breaker_window_s: float = 600.0
    delete_settle_s: float = 5.0
    confirm_batch_threshold: int = 3  # more pending candidates of a kind than this: one LIST; < 0: never
    confirm_debounce_s: float = 1.5  # candidates gathered this long (+ up to 1 s jitter) before one read

    # tenancy (sources/egress.py): who gets the node's identity, where tenant models may connect
    trusted_namespaces: TextList = Field(default_factory=list)
    tenant_endpoint_allow: TextList = Field(default_factory=list)  # added to each store's public endpoints
    cluster_cidrs: TextList = Field(default_factory=list)  # pod/service/node ranges refused to tenant models
    tenant_address_allow: TextList = Field(default_factory=list)  # exceptions to the address rules
    tenant_local_allow: TextList = Field(default_factory=list)  # directories tenants' local:// may also use
    max_failed_per_namespace: int = 50  # Failed entries + labels one namespace may show per node (0: no cap)

    # API load
    api_qps: float = 5.0
    api_burst: int = 10

    # fleet-wide origin protection (0: no limit, and no cluster-wide resolve records)
    max_concurrent_origin_fetches: int = 0
    origin_lease_s: int = 30
    # the models root is mounted on many nodes: one fetch for all, no node removes files others serve
    shared_root: bool = False

    # node-to-node distribution (model_agent.peers): off unless asked (OME's flags unchanged); the chart turns it on
    peer_enabled: bool = False
    peer_port: int = DEFAULT_PEER_PORT
    peer_bind_address: str = "0.0.0.0"
    peer_advertise_address: str = ""  # host:port other nodes use; "" -> POD_IP and peer_port
    peer_token_file: str = ""  # projected ServiceAccount token for peer_audience, re-read when it changes
    peer_audience: str = DEFAULT_PEER_AUDIENCE
    peer_allowed_username: str = ""  # "" -> system:serviceaccount:<namespace>:model-agent
    peer_upload_rate: float = 0.0  # bytes/s to all peers together; 0: no cap
    peer_max_per_peer: int = 32  # requests in flight per peer address; more get 429
    peer_ban_seconds: float = 600.0

    # drift and load
    resync_interval_s: float = 300.0
    verify_interval_s: float = 86400.0
    verify_rate_bytes_s: float = 200e6
    workers: int = 100
    startup_jitter_s: float = 0.0

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
        return PeerConfig(
            enabled=self.peer_enabled,
            port=self.peer_port,
            bind_address=self.peer_bind_address,
            advertise_address=self.peer_advertise_address,
            token_file=self.peer_token_file,
            audience=self.peer_audience,
            allowed_username=self.peer_allowed_username,
            upload_rate=self.peer_upload_rate,
            max_per_peer=self.peer_max_per_peer,
            ban_s=self.peer_ban_seconds,
        )

    def tenancy_policy(self) -> TenancyPolicy:
        """The tenancy rules from these settings; ValueError for a malformed pattern or range."""
        return TenancyPolicy.build(
            trusted_namespaces=self.trusted_namespaces,
            endpoint_allow=self.tenant_endpoint_allow,
            cluster_ranges=self.cluster_cidrs,
            address_allow=self.tenant_address_allow,
        )

    @field_validator("multipart_part_size")
    @classmethod
    def _part_size(cls, value: str) -> str:
        if value and parse_size(value) < 1:
            raise ValueError("must be at least one byte")
        return value

    @field_validator("multipart_concurrency", "max_failed_per_namespace")
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

    @field_validator("num_download_worker", "workers", "node_label_retry", "download_retry")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value
