"""Provisioner settings, from `GPUFLEET_*` environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet_bus.streams import NODE_LOG_MAX_BYTES, NODE_LOG_MAX_MSGS, NodeLogLimits
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .gcp import GcpEndpoints
from .scaling import ScalePolicy


class ProvisionerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    # R-NODE-2: a new node lands in maintenance for its operator; development (`just up`, the
    # e2e system) turns this on: active at once, an agent nobody added registers itself.
    auto_activate_nodes: bool = False
    # Development only (never a marketplace): a node failing R-NODE-4 keeps its failed_rules
    # but is not held in maintenance for them (a VM with a real GPU and no NVMe or TPM).
    waive_hardware_rules: bool = False
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
    # Verified nodes (checks.py): a GPU check is answered within node_check_deadline_s (the
    # node's own budget is 80% of it); a verified node is checked again after
    # node_check_interval_s, one whose check could not run after node_check_retry_s; due
    # and overdue checks are looked for every node_check_round_s. The check must allocate
    # the catalogue's memory of each GPU less node_check_memory_margin of it.
    node_check_deadline_s: float = Field(default=300.0, gt=0)
    node_check_interval_s: float = Field(default=86400.0, gt=0)
    node_check_retry_s: float = Field(default=3600.0, gt=0)
    node_check_round_s: float = Field(default=5.0, gt=0)
    node_check_memory_margin: float = Field(default=0.10, ge=0, lt=1)
    # Burst policy defaults (per account overrides live on its gcp provider).
    burst_max_nodes: int = Field(default=4, ge=0)
    burst_max_nodes_per_region: int = Field(default=4, ge=0)
    burst_max_new_per_pass: int = Field(default=2, ge=1)
    burst_idle_s: float = Field(default=300.0, ge=0)
    burst_retry_s: float = Field(default=30.0, ge=0)  # after an insert failed in a region
    # What each node's log stream keeps at most (gpufleet_bus.streams): its oldest chunks go
    # first past either; the bytes are reserved in the JetStream store when it enrols.
    node_log_max_bytes: int = Field(default=NODE_LOG_MAX_BYTES, ge=1024 * 1024)
    node_log_max_msgs: int = Field(default=NODE_LOG_MAX_MSGS, ge=1024)
    # Google Cloud's endpoints, for an emulator (gcp.py): none means Google's own.
    gcp_compute_endpoint: str | None = None
    gcp_grpc_endpoint: str | None = None  # or PUBSUB_EMULATOR_HOST

    # Alerts (alerts/): rules are evaluated against this Prometheus (its HTTP API) every
    # alert_eval_s; none: no rule is evaluated (rules are still kept). Each account keeps
    # at most alert_rules_per_account rules, each rule at most alert_instances_per_rule
    # alerts at once (label sets past it are left out, the rule says `truncated`) and as
    # many resolved ones, none older than alert_resolved_keep_s.
    prometheus_url: str | None = None
    alert_eval_s: float = Field(default=15.0, gt=0)
    alert_query_timeout_s: float = Field(default=10.0, gt=0)
    alert_rules_per_account: int = Field(default=50, ge=1)
    alert_instances_per_rule: int = Field(default=200, ge=1)
    alert_resolved_keep_s: float = Field(default=7 * 86400.0, gt=0)
    # The built-in XID and uncorrected-ECC rules put their node into maintenance.
    alert_builtin_maintenance: bool = True

    def node_logs(self) -> NodeLogLimits:
        return NodeLogLimits(max_bytes=self.node_log_max_bytes, max_msgs=self.node_log_max_msgs)

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
