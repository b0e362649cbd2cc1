"""Verified nodes: the GPU check the provisioner asks of a node, the node's answer, and the
verdict (services/provisioner/README.md, "Verified nodes").

The control plane asks and the node answers: `VerifyGpus` goes to the node's own command
stream with a fresh random nonce; the node runs gpufleet's check out of process and
publishes `GpuCheckReported` on its own subject (only its credential may), bound to that
nonce; the provisioner judges it against the registration and the catalogue and publishes
`NodeVerified`. A node that is not verified takes only its owner's jobs.

Everything in a `GpuCheckReported` is the node's word: it is bounded here (how many GPUs,
how long each text) and judged by the provisioner, never trusted.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from . import limits, subjects
from .base import Command, Event
from .fields import Int, Name
from .nodes import NodeDetail, NodeRequest

# What a node may report: more GPUs than any machine has, texts long enough for any
# NVML name, UUID or driver error, never a message that fills the stream.
MAX_GPUS = 64
TEXT_CHARS = 2000


class VerifyGpus(Command):
    """Durable command to one node: run gpufleet's GPU check now and answer with `nonce`
    (its answer counts only on its own subject, for this check, before `deadline`)."""

    TYPE = "gpufleet.node.verify_gpus.v1"
    SUBJECT = subjects.command("node", "verify_gpus")
    minion_id: Name
    check_id: str = Field(min_length=1, max_length=64)
    nonce: str = Field(min_length=16, max_length=128)
    timeout_s: float = Field(gt=0)  # the check's own budget, well within the deadline
    deadline: datetime


class CheckedGpu(BaseModel):
    """One GPU as the check found it: NVML's facts, then what CUDA proved (memory
    allocated and written, device memory bandwidth measured)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    index: Int = Field(ge=0, le=MAX_GPUS)
    uuid: str = Field(max_length=128)
    nvml_name: str = Field(max_length=256)
    memory_total_mb: Int = Field(ge=0)  # NVML's total, MiB
    pcie_gen: Int | None = None  # max link generation, as registered
    pcie_width: Int | None = None  # max link width, as registered
    mig_mode: bool | None = None
    # Held by a worker of this node when the check ran: NVML's facts only, not measured.
    in_use: bool = False
    allocated_mb: Int | None = Field(default=None, ge=0)  # device memory allocated and written
    bandwidth_gbps: float | None = Field(default=None, ge=0)  # device-to-device copy, GB/s
    error: str | None = Field(default=None, max_length=TEXT_CHARS)  # why it was not proved


class GpuCheck(BaseModel):
    """What `python -m gpufleet_node_agent.gpucheck` found on the node."""

    model_config = ConfigDict(frozen=True, extra="allow")

    simulated: bool = False  # simulated GPUs: nothing to check
    driver_version: str | None = Field(default=None, max_length=128)
    # The check could not look at the GPUs at all: no NVIDIA driver, it failed, it timed out.
    error: str | None = Field(default=None, max_length=TEXT_CHARS)
    gpus: list[CheckedGpu] = Field(default_factory=list, max_length=MAX_GPUS)
    cpu_count: Int | None = Field(default=None, ge=0)  # logical CPUs the check saw
    memory_mb: Int | None = Field(default=None, ge=0)  # MemTotal, MiB
    took_s: float | None = Field(default=None, ge=0)


class GpuCheckReported(Event):
    """A node's answer to `VerifyGpus`, on its own subject (only it may publish there)."""

    TYPE = "gpufleet.node.gpu_checked.v1"
    SUBJECT = subjects.event("node", "gpu_checked") + ".{minion_id}"
    minion_id: Name
    check_id: str = Field(min_length=1, max_length=64)
    nonce: str = Field(min_length=1, max_length=128)
    result: GpuCheck
    at: datetime


class NodeVerified(Event):
    """The provisioner's verdict on a node's hardware: `verified`, it may take other
    accounts' jobs. `verification_rev` grows with every verdict and every registration of
    the node, so a consumer keeps the newest whatever order it reads them in."""

    TYPE = "gpufleet.node.verified.v1"
    SUBJECT = subjects.event("node", "verified")
    node_id: str
    minion_id: Name
    verified: bool
    verification_rev: Int = Field(ge=0)
    reason: str | None = None  # why not
    checked_at: datetime | None = None
    at: datetime


class VerifyNode(NodeRequest):
    """Ask one of the account's nodes for a GPU check now (one at a time)."""

    TYPE = "gpufleet.node.verify.v1"
    SUBJECT = subjects.rpc("provisioner", "verify_node")
    REPLY = NodeDetail


class AdminVerifyNode(Command):
    """An operator's request: a GPU check now of a node of `account`."""

    TYPE = "gpufleet.node.admin_verify.v1"
    SUBJECT = subjects.admin("provisioner", "verify_node")
    REPLY = NodeDetail
    account: str = Field(min_length=1, max_length=64)
    node: str = Field(min_length=1, max_length=limits.NAME_CHARS)
