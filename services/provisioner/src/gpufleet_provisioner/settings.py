"""Provisioner settings, from `GPUFLEET_*` environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .gcp import GcpEndpoints
from .scaling import ScalePolicy


class ProvisionerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    auto_activate_nodes: bool = True
    # The signing keys that issue and revoke credentials (gpufleet_auth.Issuer.load).
    auth_dir: Path | None = None
    # Fernet key (urlsafe base64, 32 bytes) that encrypts stored secrets (R-PROV-2).
    secret_key: str | None = Field(default=None, repr=False)
    # Liveness: a node is `lost` after this many heartbeat periods without one (its own
    # period, from its registration), and never sooner than node_lost_min_s.
    node_lost_missed_heartbeats: int = Field(default=3, ge=1)
    node_lost_min_s: float = Field(default=10.0, gt=0)
    provisioner_tick_s: float = Field(default=1.0, gt=0)  # liveness rounds, burst passes
    # A heartbeat handled this much later than its node's usual delay, or a liveness round
    # this late, means the provisioner is behind: no silence is judged until it caught up.
    heartbeat_late_s: float = Field(default=1.0, gt=0)
    # Burst policy defaults (per account overrides live on its gcp provider).
    burst_max_nodes: int = Field(default=4, ge=0)
    burst_max_nodes_per_region: int = Field(default=4, ge=0)
    burst_max_new_per_pass: int = Field(default=2, ge=1)
    burst_idle_s: float = Field(default=300.0, ge=0)
    burst_retry_s: float = Field(default=30.0, ge=0)  # after an insert failed in a region
    # Google Cloud's endpoints, for an emulator (gcp.py): none means Google's own.
    gcp_compute_endpoint: str | None = None
    gcp_grpc_endpoint: str | None = None  # or PUBSUB_EMULATOR_HOST

    def policy(self) -> ScalePolicy:
        return ScalePolicy(
            max_nodes=self.burst_max_nodes,
            max_nodes_per_region=self.burst_max_nodes_per_region,
            max_new_per_pass=self.burst_max_new_per_pass,
            idle_s=self.burst_idle_s,
        )

    def gcp_endpoints(self) -> GcpEndpoints:
        return GcpEndpoints(
            compute=self.gcp_compute_endpoint or None,
            grpc=self.gcp_grpc_endpoint or os.environ.get("PUBSUB_EMULATOR_HOST") or None,
        )
