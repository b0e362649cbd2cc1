"""The node's series: each GPU labelled with the jobs holding it (shares: one series each),
idle GPUs with empty job and account, XIDs tallied, the bytes each job's staging moved."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from gpufleet_contracts.locations import S3Source, WebSource
from gpufleet_contracts.nodes import GpuInfo, GpuSample, XidEvent
from gpufleet_node_agent.host.metrics import (
    GPU_LABELS,
    Holder,
    NodeLabels,
    XidTally,
    gpu_families,
    holders,
    host_families,
    transfer_families,
)
from gpufleet_node_agent.host.telemetry import HostSample
from gpufleet_node_agent.staging.registry import Fetchers, Moved, Transfer, Uploaders
from gpufleet_node_agent.staging.tally import TransferTally
from gpufleet_node_agent.worker.spec import WorkerSpec

NODE = NodeLabels("m-1", "eu", "alice")
GPUS = [
    GpuInfo(index=i, uuid=f"GPU-{i}", model="H100", nvml_name="H100", memory_mb=80)
    for i in (0, 1, 2)
]
AT = "2026-11-27T00:00:00Z"


def spec(job: str, owner: str, gpus: tuple[int, ...], fraction: str | None = None) -> WorkerSpec:
    return WorkerSpec(
        placement_id=f"p-{job}",
        job_id=job,
        worker=0,
        gpu_indices=gpus,
        owner=owner,
        gpu_fraction=None if fraction is None else Decimal(fraction),
    )


def test_holders_by_gpu_one_per_job() -> None:
    specs = [
        spec("j-a", "bob", (0,), "0.5"),
        spec("j-b", "carol", (0,), "0.5"),
        spec("j-c", "bob", (1, 2)),
        spec("j-c", "bob", (1,)),  # a second worker of one job on a GPU counts once
    ]
    assert holders(specs) == {
        0: [Holder("j-a", "bob"), Holder("j-b", "carol")],
        1: [Holder("j-c", "bob")],
        2: [Holder("j-c", "bob")],
    }


def test_each_gpu_series_names_its_jobs_or_none() -> None:
    samples = [
        GpuSample(index=0, utilization_pct=90, memory_used_mb=10, temperature_c=70, power_w=200.5),
        GpuSample(
            index=1, utilization_pct=95, ecc_volatile_uncorrected=2, remapped_rows_corrected=1
        ),
        GpuSample(index=2, utilization_pct=0, xid_events=[XidEvent(xid=79, at=AT)]),
    ]
    xids = XidTally()
    xids.add(samples)
    held = holders(
        [
            spec("j-a", "bob", (0,), "0.5"),
            spec("j-b", "carol", (0,), "0.5"),
            spec("j-c", "bob", (1,)),
        ]
    )
    families = {f.name: f for f in gpu_families(NODE, GPUS, samples, held, xids)}
    util = {
        tuple(s.labels[k] for k in GPU_LABELS): s.value
        for s in families["gpufleet_gpu_utilization_percent"].samples
    }
    assert util == {
        ("m-1", "eu", "alice", "0", "GPU-0", "j-a", "bob"): 90,
        ("m-1", "eu", "alice", "0", "GPU-0", "j-b", "carol"): 90,
        ("m-1", "eu", "alice", "1", "GPU-1", "j-c", "bob"): 95,
        ("m-1", "eu", "alice", "2", "GPU-2", "", ""): 0,
    }
    for family in families.values():
        for s in family.samples:
            assert (s.labels["gpu"] == "2") == (s.labels["job"] == ""), s
    memory = families["gpufleet_gpu_memory_used_bytes"].samples
    assert {s.value for s in memory} == {10 * 1024 * 1024}  # GPUs 1 and 2 did not say
    ecc = [s for s in families["gpufleet_gpu_ecc_errors"].samples if s.value]
    assert [(s.labels["gpu"], s.labels["counter"], s.labels["scope"], s.value) for s in ecc] == [
        ("1", "uncorrected", "volatile", 2)
    ]
    xid = {s.labels["gpu"]: s.value for s in families["gpufleet_gpu_last_xid"].samples}
    assert xid == {"0": 0, "1": 0, "2": 79}
    total = families["gpufleet_gpu_xid_errors"].samples
    assert {(s.name, s.labels["gpu"], s.value) for s in total if s.value} == {
        ("gpufleet_gpu_xid_errors_total", "2", 1)
    }
    xids.add([GpuSample(index=2, xid_events=[XidEvent(xid=48, at=AT), XidEvent(xid=79, at=AT)])])
    assert (xids.count[2], xids.last[2]) == (3, 79)


def test_host_series() -> None:
    host = HostSample(
        cpu_pct=12.5,
        ram_used_mb=1024,
        ram_total_mb=2048,
        disk_used_bytes=5,
        disk_total_bytes=10,
        disk_read_bytes=7,
        disk_write_bytes=None,
    )
    out = {s.name: (s.labels, s.value) for f in host_families(NODE, host) for s in f.samples}
    labels = {"node": "m-1", "region": "eu", "owner": "alice"}
    assert out == {
        "gpufleet_node_cpu_percent": (labels, 12.5),
        "gpufleet_node_memory_used_bytes": (labels, 1024 * 1024 * 1024),
        "gpufleet_node_memory_total_bytes": (labels, 2048 * 1024 * 1024),
        "gpufleet_node_disk_used_bytes": (labels, 5),
        "gpufleet_node_disk_total_bytes": (labels, 10),
        "gpufleet_node_disk_read_bytes_total": (labels, 7),
    }


async def test_a_jobs_staged_and_uploaded_bytes_count_what_its_transfers_tell() -> None:
    now = [0.0]
    tally = TransferTally(clock=lambda: now[0], keep_s=60)

    async def fetch(source: Any, dest: Path, t: Transfer) -> None:
        for moved in (Moved(0, waiting=True), Moved(3, 10), Moved(10, 10), Moved(10, 10)):
            t.progress(moved)
        t.progress(Moved(4, 10))  # a retry from the start: counted past the furthest only
        t.progress(Moved(12, 12))

    async def put(path: Path, target: Any, t: Transfer) -> None:
        t.progress(Moved(7, 7))

    heard: list[Moved] = []
    fetchers = tally.fetchers(Fetchers({"web": fetch}))
    uploaders = tally.uploaders(Uploaders({"s3": put}))
    t = Transfer({}, 100, heard.append, job_id="j-1", account="bob")
    await fetchers.fetch(WebSource(url="https://example.org/a.zip"), Path("."), t)
    await uploaders.put(Path("out.zip"), S3Source(url="s3://b/out/"), t)
    assert heard[-2:] == [Moved(12, 12), Moved(7, 7)]  # the worker's progress still told

    def served() -> dict[tuple[str, str, str, str], float]:
        return {
            (s.name, s.labels["job"], s.labels["account"], s.labels["kind"]): s.value
            for f in transfer_families(NODE, tally)
            for s in f.samples
            if s.labels["node"] == "m-1"
        }

    assert served() == {
        ("gpufleet_staged_bytes_total", "j-1", "bob", "web"): 12,
        ("gpufleet_uploaded_bytes_total", "j-1", "bob", "s3"): 7,
    }
    now[0] = 59.0
    assert len(served()) == 2  # kept for the scrapes after the job's last transfer
    now[0] = 61.0
    assert served() == {}
