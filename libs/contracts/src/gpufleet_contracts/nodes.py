"""Node commands and events (PRODUCT.md section 3)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from . import subjects
from .base import Command, Event


class NodeState(StrEnum):
    provisioning = "provisioning"
    maintenance = "maintenance"
    active = "active"
    lost = "lost"
    removed = "removed"


class GpuInfo(BaseModel):
    """One GPU as the node agent saw it (R-NODE-6)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    index: int
    uuid: str
    model: str | None  # catalogue model, None when NVML's name is not in the catalogue
    nvml_name: str
    memory_mb: int
    pcie_gen: int | None = None
    pcie_width: int | None = None
    mig_mode: bool | None = None


class RegisterNode(Command):
    TYPE = "gpufleet.node.register.v1"
    SUBJECT = subjects.command("provisioner", "register_node")
    minion_id: str
    name: str
    region: str
    owner: str
    hostname: str
    gpus: list[GpuInfo]
    simulated: bool
    inventory_source: str  # "nvml" or the simulated inventory file
    driver_version: str | None = None
    price_per_gpu_hour: Decimal | None = None  # asking price when selling to other accounts
    agent_started_at: datetime


class NodeRegistered(Event):
    TYPE = "gpufleet.node.registered.v1"
    SUBJECT = subjects.event("node", "registered")
    node_id: str
    minion_id: str
    name: str
    region: str
    owner: str
    state: NodeState
    gpus: list[GpuInfo]
    simulated: bool
    price_per_gpu_hour: Decimal | None = None
    allow_public_jobs: bool = False
    at: datetime


class NodeStateChanged(Event):
    TYPE = "gpufleet.node.state_changed.v1"
    SUBJECT = subjects.event("node", "state_changed")
    node_id: str
    minion_id: str
    state: NodeState
    reason: str | None = None
    at: datetime


class GpuSample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    index: int
    utilization_pct: int | None = None
    memory_used_mb: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None


class NodeHeartbeat(Event):
    """Core NATS, every few seconds; a lost one is harmless."""

    TYPE = "gpufleet.node.heartbeat.v1"
    SUBJECT = subjects.HEARTBEATS + ".{minion_id}"
    minion_id: str
    at: datetime
    running: list[str] = Field(default_factory=list)  # "<job_id>/<worker>"
    gpus: list[GpuSample] = Field(default_factory=list)
    cpu_pct: float | None = None
    ram_used_mb: int | None = None
