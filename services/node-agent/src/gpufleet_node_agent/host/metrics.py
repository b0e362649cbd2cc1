"""The node's Prometheus series (docs/metrics.md): its GPUs, each attributed to the jobs that
hold it, and the host, from the last heartbeat's sample; the bytes its staging moved per job.

Attribution is by construction: the labels come from the placements this agent holds at the
scrape, so no sample of a held GPU lacks its job. A GPU shared by fractional workers
(R-SCHED-4) has one series per job holding it, each with the GPU's whole values (NVML has no
per-process utilisation under MPS): sum a GPU quantity across GPUs with
`max by (node, gpu_uuid) (...)`, never a plain `sum`. An idle GPU has `job=""` and
`account=""`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet_contracts.nodes import GpuInfo, GpuSample
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..staging.tally import Direction, TransferTally
from ..worker.spec import WorkerSpec
from .telemetry import HostSample

MIB = 1024 * 1024
NODE_LABELS = ("node", "region", "owner")
GPU_LABELS = (*NODE_LABELS, "gpu", "gpu_uuid", "job", "account")


@dataclass(frozen=True)
class NodeLabels:
    node: str  # the minion id, as every service labels it
    region: str
    owner: str  # the node's account

    def values(self) -> list[str]:
        return [self.node, self.region, self.owner]


@dataclass(frozen=True)
class Holder:
    """A job holding a GPU, and the account it runs for (its project's owner)."""

    job: str
    account: str


def holders(specs: Iterable[WorkerSpec]) -> dict[int, list[Holder]]:
    """Each GPU's holders, by GPU index: one per job (several workers of one job on one GPU
    count once), in job order."""
    held: dict[int, set[Holder]] = {}
    for spec in specs:
        for index in spec.gpu_indices:
            held.setdefault(index, set()).add(Holder(spec.job_id, spec.owner or ""))
    return {i: sorted(hs, key=lambda h: (h.job, h.account)) for i, hs in held.items()}


@dataclass
class XidTally:
    """XIDs seen since the agent started, per GPU: how many, and the last one."""

    count: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)

    def add(self, samples: Sequence[GpuSample]) -> None:
        for s in samples:
            for event in s.xid_events or []:
                self.count[s.index] = self.count.get(s.index, 0) + 1
                self.last[s.index] = event.xid


# (name, help, the sample's value) of the plain per-GPU gauges
GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("gpufleet_gpu_utilization_percent", "GPU utilisation (NVML), %.", lambda s: s.utilization_pct),
    (
        "gpufleet_gpu_memory_used_bytes",
        "GPU memory in use, bytes.",
        lambda s: None if s.memory_used_mb is None else s.memory_used_mb * MIB,
    ),
    ("gpufleet_gpu_temperature_celsius", "GPU temperature, C.", lambda s: s.temperature_c),
    ("gpufleet_gpu_power_watts", "GPU power draw, W.", lambda s: s.power_w),
    (
        "gpufleet_gpu_retired_pages",
        "Memory pages retired for ECC errors (before Ampere).",
        lambda s: s.retired_pages,
    ),
    (
        "gpufleet_gpu_remapped_rows_pending",
        "1 when a row remapping waits for the GPU's reset.",
        lambda s: None if s.remapped_rows_pending is None else int(s.remapped_rows_pending),
    ),
    (
        "gpufleet_gpu_row_remap_failed",
        "1 when a row remapping failed (the GPU needs service).",
        lambda s: None if s.remapped_rows_failed is None else int(s.remapped_rows_failed),
    ),
)

ECC: tuple[tuple[str, str, Callable[[GpuSample], int | None]], ...] = (
    ("corrected", "volatile", lambda s: s.ecc_volatile_corrected),
    ("uncorrected", "volatile", lambda s: s.ecc_volatile_uncorrected),
    ("corrected", "aggregate", lambda s: s.ecc_aggregate_corrected),
    ("uncorrected", "aggregate", lambda s: s.ecc_aggregate_uncorrected),
)


def gpu_families(
    node: NodeLabels,
    gpus: Sequence[GpuInfo],
    samples: Sequence[GpuSample],
    held: dict[int, list[Holder]],
    xids: XidTally,
) -> list[Metric]:
    """Every GPU series of one scrape: one row per (GPU, job holding it), or one with empty
    job and account for an idle GPU."""
    uuids = {g.index: g.uuid for g in gpus}
    total_mb = {g.index: g.memory_mb for g in gpus}
    gauges = {name: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, doc, _ in GPU_GAUGES}
    memory_total = GaugeMetricFamily(
        "gpufleet_gpu_memory_total_bytes", "GPU memory, bytes.", labels=GPU_LABELS
    )
    ecc = GaugeMetricFamily(
        "gpufleet_gpu_ecc_errors",
        "ECC errors: volatile (since the driver loaded) or aggregate (the GPU's life).",
        labels=(*GPU_LABELS, "counter", "scope"),
    )
    remapped = GaugeMetricFamily(
        "gpufleet_gpu_remapped_rows",
        "Rows remapped for ECC errors (Ampere and later), by the errors' kind.",
        labels=(*GPU_LABELS, "counter"),
    )
    last_xid = GaugeMetricFamily(
        "gpufleet_gpu_last_xid",
        "The last XID error the driver raised on the GPU since the agent started; 0: none.",
        labels=GPU_LABELS,
    )
    xid_total = CounterMetricFamily(
        "gpufleet_gpu_xid_errors",
        "XID errors the driver raised on the GPU since the agent started.",
        labels=GPU_LABELS,
    )
    for s in samples:
        rows = held.get(s.index) or [Holder("", "")]
        for h in rows:
            labels = [*node.values(), str(s.index), uuids.get(s.index, ""), h.job, h.account]
            for name, _, value in GPU_GAUGES:
                v = value(s)
                if v is not None:
                    gauges[name].add_metric(labels, v)
            if s.index in total_mb:
                memory_total.add_metric(labels, total_mb[s.index] * MIB)
            for counter, scope, count in ECC:
                n = count(s)
                if n is not None:
                    ecc.add_metric([*labels, counter, scope], n)
            for counter, rows_ in (
                ("corrected", s.remapped_rows_corrected),
                ("uncorrected", s.remapped_rows_uncorrected),
            ):
                if rows_ is not None:
                    remapped.add_metric([*labels, counter], rows_)
            last_xid.add_metric(labels, xids.last.get(s.index, 0))
            xid_total.add_metric(labels, xids.count.get(s.index, 0))
    return [*gauges.values(), memory_total, ecc, remapped, last_xid, xid_total]


HOST_GAUGES: tuple[tuple[str, str, Callable[[HostSample], float | None]], ...] = (
    (
        "gpufleet_node_cpu_percent",
        "CPU busy over the last heartbeat period, %.",
        lambda h: h.cpu_pct,
    ),
    (
        "gpufleet_node_memory_used_bytes",
        "RAM in use (MemTotal - MemAvailable), bytes.",
        lambda h: None if h.ram_used_mb is None else h.ram_used_mb * MIB,
    ),
    (
        "gpufleet_node_memory_total_bytes",
        "RAM, bytes.",
        lambda h: None if h.ram_total_mb is None else h.ram_total_mb * MIB,
    ),
    (
        "gpufleet_node_disk_used_bytes",
        "Used bytes of the filesystem holding the agent's state (workers, caches).",
        lambda h: h.disk_used_bytes,
    ),
    (
        "gpufleet_node_disk_total_bytes",
        "Size of the filesystem holding the agent's state, bytes.",
        lambda h: h.disk_total_bytes,
    ),
)
HOST_COUNTERS: tuple[tuple[str, str, Callable[[HostSample], float | None]], ...] = (
    (
        "gpufleet_node_disk_read_bytes",
        "Bytes read from the node's disks.",
        lambda h: h.disk_read_bytes,
    ),
    (
        "gpufleet_node_disk_written_bytes",
        "Bytes written to the node's disks.",
        lambda h: h.disk_write_bytes,
    ),
)


def host_families(node: NodeLabels, host: HostSample) -> list[Metric]:
    out: list[Metric] = []
    for name, doc, value in HOST_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=NODE_LABELS)
        if (v := value(host)) is not None:
            family.add_metric(node.values(), v)
        out.append(family)
    for name, doc, value in HOST_COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=NODE_LABELS)
        if (v := value(host)) is not None:
            counter.add_metric(node.values(), v)
        out.append(counter)
    return out


TRANSFERS = {
    Direction.staged: (
        "gpufleet_staged_bytes",
        "Bytes staged into a job's mounts on the node, by the kind of source.",
    ),
    Direction.uploaded: (
        "gpufleet_uploaded_bytes",
        "Bytes of a job's output uploaded from the node, by the kind of target.",
    ),
}


def transfer_families(node: NodeLabels, tally: TransferTally) -> list[Metric]:
    """The bytes each job staged and uploaded (`kind`: the source's or target's)."""
    labels = (*NODE_LABELS, "job", "account", "kind")
    out = {d: CounterMetricFamily(name, doc, labels=labels) for d, (name, doc) in TRANSFERS.items()}
    for key, n in tally.counts().items():
        out[key.direction].add_metric([*node.values(), key.job, key.account, key.kind], n)
    return list(out.values())


class NodeMetrics:
    """The agent's metrics source: the last sample its heartbeat took (`sampled`), labelled
    at each scrape with the placements `specs` returns, and what `transfers` counted."""

    def __init__(
        self,
        node: NodeLabels,
        specs: Callable[[], Iterable[WorkerSpec]],
        transfers: TransferTally | None = None,
    ) -> None:
        self.node = node
        self.specs = specs
        self.transfers = transfers or TransferTally()
        self.gpus: Sequence[GpuInfo] = ()
        self.samples: Sequence[GpuSample] = ()
        self.host: HostSample | None = None
        self.xids = XidTally()

    def inventory(self, gpus: Sequence[GpuInfo]) -> None:
        self.gpus = list(gpus)

    def sampled(self, samples: Sequence[GpuSample], host: HostSample) -> None:
        self.samples, self.host = list(samples), host
        self.xids.add(samples)

    async def collect(self) -> list[Metric]:
        out = gpu_families(self.node, self.gpus, self.samples, holders(self.specs()), self.xids)
        if self.host is not None:
            out += host_families(self.node, self.host)
        return out + transfer_families(self.node, self.transfers)
