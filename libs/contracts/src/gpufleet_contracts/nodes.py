"""Node commands and events (PRODUCT.md section 3)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from . import limits, subjects
from .base import Command, Event, Message
from .environments import EnvironmentOffer
from .fields import Int, Name


class NodeState(StrEnum):
    provisioning = "provisioning"
    maintenance = "maintenance"
    active = "active"
    lost = "lost"
    removed = "removed"


class GpuInfo(BaseModel):
    """One GPU as the node agent saw it (R-NODE-6)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    index: Int
    uuid: str
    model: str | None  # catalogue model, None when NVML's name is not in the catalogue
    nvml_name: str
    memory_mb: Int
    pcie_gen: Int | None = None
    pcie_width: Int | None = None
    mig_mode: bool | None = None


class DriveInfo(BaseModel):
    """One block device (R-NODE-4): NVMe or SATA, its size and whether it spins."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str
    kind: str  # "nvme" | "sata" | "other"
    size_gb: Int
    rotational: bool = False


class NicInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    name: str
    speed_mbps: Int | None = None  # None: link down or unknown


class HardwareInventory(BaseModel):
    """What a node reports of its hardware besides the GPUs (R-NODE-4)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    drives: list[DriveInfo] = Field(default_factory=list)
    tpm_version: str | None = None  # "2.0", "1.2" or None when absent
    nics: list[NicInfo] = Field(default_factory=list)
    memory_mb: Int | None = None
    cpu_cores: Int | None = None
    gpu_form_factor: str | None = None  # "pcie" (default) or "sxm"


# A node's sealing key (gpufleet_auth.sealing): the public half of the X25519 key pair its
# agent keeps, base64. The scheduler seals each worker's secrets to it (StartWorker's
# `sealed_secrets`), so only that node can read them.
SealingKey = Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]{43}=$")]


class RegisterNode(Command):
    TYPE = "gpufleet.node.register.v1"
    SUBJECT = subjects.command("provisioner", "register_node")
    minion_id: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    region: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    owner: str
    hostname: Name = Field(max_length=255)
    gpus: list[GpuInfo]
    simulated: bool
    inventory_source: str  # "nvml", "nvml: <why no GPUs>", or the simulated inventory file
    driver_version: str | None = None
    price_per_gpu_hour: Decimal | None = None  # asking price when selling to other accounts
    agent_started_at: datetime
    gpu_shares: Int = Field(default=1, ge=1, le=16)  # R-SCHED-4: shares per physical GPU
    # Added in issue 4; older agents send none (their hardware is then "not reported").
    hardware: HardwareInventory | None = None
    heartbeat_s: float | None = None  # the agent's heartbeat period (liveness, issue 4)
    # CPU-only jobs (R-JOB-2): the logical CPUs this node offers them (the rest feed its
    # GPUs' workers), and its asking price per CPU-hour to other accounts.
    cpu_job_cpus: Int = Field(default=0, ge=0, le=limits.NODE_CPUS)
    price_per_cpu_hour: Decimal | None = Field(default=None, ge=0)
    # The public key this node's secrets are sealed to; None (an older agent): the node gets
    # no job that carries secrets (services/scheduler/README.md, "Secrets for the node alone").
    # The node's nkey signs it (gpufleet_auth.sealing.vouch): a key its enrolled nkey did not
    # sign is not kept.
    sealing_key: SealingKey | None = None
    sealing_key_signature: str | None = Field(default=None, max_length=128)
    # The base environments this node runs (R-JOB-7: the Python versions and frameworks it
    # builds, its operator's mapped images by tag); None (an older agent): what every
    # gpufleet node builds (environments.BUILT_IN).
    environments: EnvironmentOffer | None = None
    # Where its proxy serves the endpoints it runs: a URL template with `{job}` (one origin
    # per job, e.g. `http://{job}.localhost:8480`); None: it serves none (an older agent).
    proxy_url: str | None = Field(default=None, max_length=256, pattern=r"^https?://.*\{job\}")


class NodeRegistered(Event):
    TYPE = "gpufleet.node.registered.v1"
    SUBJECT = subjects.event("node", "registered")
    node_id: str
    minion_id: Name
    name: Name
    region: Name
    owner: str
    state: NodeState
    gpus: list[GpuInfo]
    simulated: bool
    price_per_gpu_hour: Decimal | None = None
    allow_public_jobs: bool = False
    at: datetime
    gpu_shares: Int = Field(default=1, ge=1, le=16)  # R-SCHED-4: shares per physical GPU
    cpu_count: Int | None = None  # its logical CPUs, as its agent reported them
    cpu_job_cpus: Int = 0  # of those, offered to CPU-only jobs (R-JOB-2)
    price_per_cpu_hour: Decimal | None = None  # asking price per CPU-hour to other accounts
    # Its hardware passed gpufleet's check (gpufleet_contracts.verification): only then does
    # it take other accounts' jobs. `verification_rev` orders this with NodeVerified.
    verified: bool = False
    verification_rev: Int = 0
    sealing_key: SealingKey | None = None  # its RegisterNode's: what its secrets are sealed to
    environments: EnvironmentOffer | None = None  # its RegisterNode's (R-JOB-7)
    proxy_url: str | None = None  # its RegisterNode's: where its endpoints are served


class NodeStateChanged(Event):
    TYPE = "gpufleet.node.state_changed.v1"
    SUBJECT = subjects.event("node", "state_changed")
    node_id: str
    minion_id: Name
    state: NodeState
    reason: str | None = None
    at: datetime
    previous: NodeState | None = None
    # lost / preempted / removed: what happens to the workers that ran there. "requeue": the
    # scheduler puts them back in the queue (a lost or preempted node says nothing about the job).
    workers: str | None = None
    failed_rules: list[str] = Field(default_factory=list)  # R-NODE-4, when it failed validation


class CloudInstanceEvent(Event):
    """A cloud instance's lifecycle, from the cloud's audit log (R-NODE-5).

    Published by the provisioner's bridge (Logging sink -> Pub/Sub -> NATS) with the Pub/Sub
    message id as `Nats-Msg-Id`, so a redelivered log entry is stored once.
    """

    TYPE = "gpufleet.node.cloud_instance.v1"
    SUBJECT = subjects.event("node", "cloud_instance")
    provider: str  # "gcp"
    project_id: str
    zone: str
    instance: str  # instance name (= the node's minion id)
    instance_id: str | None = None
    action: str  # "insert" | "delete" | "stop" | "preempted" | "other"
    method: str  # protoPayload.methodName
    phase: str  # "first" | "last" | "single" (operation.first / operation.last)
    log_insert_id: str | None = None
    timestamp: datetime
    pubsub_message_id: str
    error: str | None = None  # protoPayload.status.message when the operation failed


class XidEvent(BaseModel):
    """An XID error the NVIDIA driver raised on a GPU (NVML's XID critical error event)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    xid: Int
    at: datetime  # when the agent read it off NVML's event set


class GpuSample(BaseModel):
    """One GPU's telemetry in a heartbeat (R-NODE-6). None: not read (the GPU or its driver
    does not support it, or NVML failed); every field past `index` is optional, so an older
    agent's heartbeat stays valid."""

    model_config = ConfigDict(frozen=True, extra="allow")
    index: Int
    utilization_pct: Int | None = None
    memory_used_mb: Int | None = None
    temperature_c: Int | None = None
    power_w: float | None = None
    # ECC error counts: volatile (since the driver loaded) and aggregate (the GPU's life);
    # None on a GPU without ECC (consumer GPUs) or with ECC off.
    ecc_volatile_corrected: Int | None = None
    ecc_volatile_uncorrected: Int | None = None
    ecc_aggregate_corrected: Int | None = None
    ecc_aggregate_uncorrected: Int | None = None
    # Memory pages retired for ECC errors (before Ampere), or rows remapped (Ampere and
    # later, where pages are no longer retired); None where the GPU has neither.
    retired_pages: Int | None = None
    remapped_rows_corrected: Int | None = None
    remapped_rows_uncorrected: Int | None = None
    remapped_rows_pending: bool | None = None  # a remapping waits for the GPU's reset
    remapped_rows_failed: bool | None = None
    # The XIDs seen since the previous heartbeat (the newest XID_EVENTS); None: XIDs are not
    # watched on this GPU (its driver refused the event registration).
    xid_events: list[XidEvent] | None = Field(default=None, max_length=limits.XID_EVENTS)


class NodeHeartbeat(Event):
    """Core NATS, every few seconds; a lost one is harmless."""

    TYPE = "gpufleet.node.heartbeat.v1"
    SUBJECT = subjects.HEARTBEATS + ".{minion_id}"
    minion_id: Name
    at: datetime  # when the node sent it (liveness measures the provisioner's delay by it)
    # its heartbeats counted since its agent started: a gap says some were sent, not heard
    seq: Int | None = None
    running: list[str] = Field(default_factory=list)  # "<job_id>/<worker>"
    gpus: list[GpuSample] = Field(default_factory=list)
    cpu_pct: float | None = None
    ram_used_mb: Int | None = None
    # the filesystem of the agent's state directory (its workers' directories, caches)
    disk_used_pct: float | None = None
    disk_free_gb: float | None = None
    # the node's disks' bytes read and written since it booted (a counter: rates are deltas)
    disk_read_bytes: Int | None = None
    disk_write_bytes: Int | None = None


# --- an account's requests about its nodes (the provisioner's `node` verbs) ----------------

NodeName = Annotated[Name, Field(min_length=1, max_length=limits.NAME_CHARS)]


def _none(value: Any) -> bool:
    """A reply leaves out a key it has no value for (the CLI shows every key it gets)."""
    return value is None


class PendingCheck(BaseModel):
    """A GPU check on its way: when it was asked, by when the node must answer, and why."""

    sent_at: str | None
    deadline: str | None
    why: str | None


class VerificationView(BaseModel):
    """Whether a compute node is verified (it may take other accounts' jobs) or why not, when
    it was checked, and a check on its way. Never the check's nonce."""

    verified: bool
    reason: str | None
    checked_at: str | None  # ISO 8601
    pending: PendingCheck | None = Field(default=None, exclude_if=_none)


class VerificationDetail(VerificationView):
    """A node's verification shown alone: also what was checked and when it is next."""

    checks: list[str]  # "ok: ..." / "failed: ..."
    next_check: str | None


class CloudView(BaseModel):
    """A cloud node's instance (R-NODE-5); shown alone, the lifecycle entries it went
    through. Not the provisioner's own bookkeeping of those entries (their rank)."""

    project_id: str | None = None
    zone: str | None = None
    gpu_type: str | None = None
    gpu_count: Int | None = None
    state: str | None = None  # requested | provisioning | running | failed | deleted ...
    demand: str | None = None  # the worker it was asked for, `<job_id>/<index>`
    created_ms: Int | None = None
    instance_id: str | None = Field(default=None, exclude_if=_none)
    operation: str | None = Field(default=None, exclude_if=_none)
    error: str | None = Field(default=None, exclude_if=_none)
    delete_requested: bool | None = Field(default=None, exclude_if=_none)
    delete_reason: str | None = Field(default=None, exclude_if=_none)
    history: list[dict[str, Any]] | None = Field(default=None, exclude_if=_none)


class NodeView(BaseModel):
    """A node as listed (`list_nodes`, `add_node`): never its credential, its sealing key's
    public half or a GPU check's nonce."""

    node_id: str
    minion_id: str
    name: str
    region: str
    owner: str
    state: NodeState
    kind: str  # compute | storage
    provider: str  # physical | gcp
    gpus: list[GpuInfo]
    simulated: bool
    inventory_source: str | None  # "nvml", "nvml: <why no GPUs>", a simulated inventory
    failed_rules: list[str]  # the hardware rules it fails (R-NODE-4)
    last_seen: str | None  # its last heartbeat, ISO 8601
    telemetry: dict[str, Any] | None  # that heartbeat (NodeHeartbeat's fields)
    # a compute node asked for a GPU check; None (left out) for one never asked
    verified: bool | None = Field(default=None, exclude_if=_none)
    verification: VerificationView | None = Field(default=None, exclude_if=_none)
    cloud: CloudView | None = Field(default=None, exclude_if=_none)


class NodeHistoryEntry(BaseModel):
    """One state a node went through, when (ms since the epoch) and why."""

    state: str
    at_ms: Int | None = None
    reason: str | None = None


class NodeDetail(NodeView):
    """A node shown alone (`show_node`, and `remove_node` when it removes it): also its
    hardware, history and idleness, and which key its workers' secrets are sealed to."""

    verification: VerificationDetail | None = Field(default=None, exclude_if=_none)
    sealing_key: str | None  # its key's id; None: its agent is too old for jobs with secrets
    hardware: HardwareInventory | None
    environments: EnvironmentOffer | None = Field(default=None, exclude_if=_none)  # R-JOB-7
    history: list[NodeHistoryEntry]
    busy: bool
    idle_since: str | None


class MaintenanceSet(NodeDetail):
    """The reply to SetMaintenance: the node as it is now; `changed: false` when it already
    was in the state asked for (and nothing was published)."""

    changed: bool


class NodeList(Message):
    """The reply to ListNodes: each node as listed (without its history)."""

    nodes: list[NodeView]


class ListNodes(Command):
    """An account's request: its nodes; removed ones only with `include_removed`."""

    TYPE = "gpufleet.node.list.v1"
    SUBJECT = subjects.rpc("provisioner", "list_nodes")
    REPLY = NodeList
    READ = True
    include_removed: bool = False


class AddNode(Command):
    """Add a compute or storage node by its minion id (R-NODE-2/3); `replace` replaces the
    region's storage node. The kind, the minion id's form and `mining` are the rules' to check
    (their refusals name R-NODE-1/2/3)."""

    TYPE = "gpufleet.node.add.v1"
    SUBJECT = subjects.rpc("provisioner", "add_node")
    REPLY = NodeView
    region: NodeName
    name: NodeName
    minion_id: str = Field(min_length=1)
    kind: str = "compute"  # compute | storage
    upnp: bool = True
    mining: bool = False
    replace: bool = False


class NodeRequest(Command):
    """A request about one node of the account: its name, minion id or node id."""

    node: str = Field(min_length=1, max_length=limits.NAME_CHARS)


class ShowNode(NodeRequest):
    """One node: its state, history, hardware and the rules it fails."""

    TYPE = "gpufleet.node.show.v1"
    SUBJECT = subjects.rpc("provisioner", "show_node")
    REPLY = NodeDetail
    READ = True


class SetMaintenance(NodeRequest):
    """Put a node in maintenance (`on`: active -> maintenance) or back in service (`off`:
    maintenance -> active; a node failing R-NODE-4 stays out of service). A node already in
    the state asked for is left as it is: asking twice changes nothing."""

    TYPE = "gpufleet.node.set_maintenance.v1"
    SUBJECT = subjects.rpc("provisioner", "set_maintenance")
    REPLY = MaintenanceSet
    maintenance: bool


class RemoveNode(NodeRequest):
    """Remove a node (its credential is revoked first; its workers are requeued)."""

    TYPE = "gpufleet.node.remove.v1"
    SUBJECT = subjects.rpc("provisioner", "remove_node")
    REPLY = NodeView
