"""Node agent telemetry: NVML's samples mapped (a fake pynvml), simulated GPUs and their
control file, the host's CPU, RAM and disk (R-NODE-6)."""

from __future__ import annotations

import json
import os
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts import limits
from gpufleet_contracts.nodes import GpuInfo, NodeHeartbeat
from gpufleet_node_agent.host import telemetry as tel
from gpufleet_node_agent.host.inventory import Inventory, read_inventory
from gpufleet_node_agent.host.telemetry import (
    CONTROL_FILE,
    HostSampler,
    NvmlSampler,
    SimulatedSampler,
    gpu_sampler,
)
from gpufleet_node_agent.settings import AgentSettings

from .test_inventory import DEVICES, FakeNotSupported, FakeNVMLError, fake_pynvml

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
XID = 8  # pynvml.nvmlEventTypeXidCriticalError
CORRECTED, UNCORRECTED = 0, 1
VOLATILE, AGGREGATE = 0, 1


class FakeTimeout(FakeNVMLError):
    pass


def nvml(devices: list[dict[str, Any]]) -> types.SimpleNamespace:
    """The inventory's fake pynvml, with ECC, retired pages, remapped rows and XID events:
    a device's key missing (or None) is NOT_SUPPORTED."""
    fake = fake_pynvml(devices)
    sets: list[dict[str, Any]] = []

    def maybe(h: int, key: str) -> Any:
        value = devices[h].get(key)
        if value is None:
            raise FakeNotSupported()
        return value

    def ecc(h: int, error: int, counter: int) -> int:
        return int(maybe(h, "ecc")[(counter, error)])

    def retired(h: int, cause: int) -> list[int]:
        return list(maybe(h, "retired")[cause])

    def create() -> int:
        sets.append({"device": None, "pending": []})
        return len(sets) - 1

    def register(h: int, types_: int, s: int) -> None:
        assert types_ == XID
        if not devices[h].get("xid_watch", True):
            raise FakeNotSupported()
        sets[s]["device"] = h

    def wait(s: int, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # polled: a heartbeat never waits on NVML
        pending = sets[s]["pending"]
        if not pending:
            raise FakeTimeout()
        kind, data = pending.pop(0)
        return types.SimpleNamespace(eventType=kind, eventData=data, device=sets[s]["device"])

    def free(s: int) -> None:
        fake.calls.append(f"free {s}")

    def raise_xid(h: int, xid: int, kind: int = XID) -> None:
        for s in sets:
            if s["device"] == h:
                s["pending"].append((kind, xid))

    fake.__dict__.update(
        NVML_MEMORY_ERROR_TYPE_CORRECTED=CORRECTED,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=UNCORRECTED,
        NVML_VOLATILE_ECC=VOLATILE,
        NVML_AGGREGATE_ECC=AGGREGATE,
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        nvmlEventTypeXidCriticalError=XID,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlDeviceGetRetiredPages=retired,
        nvmlDeviceGetRemappedRows=lambda h: maybe(h, "remapped"),
        nvmlEventSetCreate=create,
        nvmlDeviceRegisterEvents=register,
        nvmlEventSetWait=wait,
        nvmlEventSetFree=free,
        raise_xid=raise_xid,
        sets=sets,
    )
    return fake


def ecc_counts(vc: int, vu: int, ac: int, au: int) -> dict[tuple[int, int], int]:
    return {
        (VOLATILE, CORRECTED): vc,
        (VOLATILE, UNCORRECTED): vu,
        (AGGREGATE, CORRECTED): ac,
        (AGGREGATE, UNCORRECTED): au,
    }


# a V100 (pages retired), an A100 (rows remapped), a consumer GPU (no ECC, no XID events)
TELEMETRY_DEVICES = [
    DEVICES[0] | {"ecc": ecc_counts(3, 0, 40, 1), "retired": [[0x1000, 0x2000], [0x3000]]},
    DEVICES[1] | {"ecc": ecc_counts(0, 2, 7, 2), "remapped": (4, 1, 1, 0)},
    DEVICES[2] | {"xid_watch": False},
]


def sampler(monkeypatch: pytest.MonkeyPatch, devices: list[dict[str, Any]]) -> Any:
    fake = nvml(devices)
    monkeypatch.setattr(tel, "pynvml", fake)
    return fake, NvmlSampler(range(len(devices)), clock=lambda: NOW)


def test_nvml_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, s = sampler(monkeypatch, TELEMETRY_DEVICES)
    a, b, c = s.sample(set())
    assert (a.index, a.utilization_pct, a.memory_used_mb, a.temperature_c, a.power_w) == (
        0,
        7,
        100,
        41,
        30.5,
    )
    assert (b.utilization_pct, b.temperature_c, b.power_w) == (0, None, None)  # NOT_SUPPORTED
    assert (c.temperature_c, c.power_w) == (30, 1.0)
    # ECC: volatile / aggregate x corrected / uncorrected; a consumer GPU has none
    ecc = [
        (
            x.ecc_volatile_corrected,
            x.ecc_volatile_uncorrected,
            x.ecc_aggregate_corrected,
            x.ecc_aggregate_uncorrected,
        )
        for x in (a, b, c)
    ]
    assert ecc == [(3, 0, 40, 1), (0, 2, 7, 2), (None, None, None, None)]
    # pages retired (both causes) before Ampere, rows remapped after
    assert (a.retired_pages, a.remapped_rows_corrected, a.remapped_rows_pending) == (3, None, None)
    assert (b.retired_pages, b.remapped_rows_corrected, b.remapped_rows_uncorrected) == (
        None,
        4,
        1,
    )
    assert (b.remapped_rows_pending, b.remapped_rows_failed) == (True, False)
    assert (c.retired_pages, c.remapped_rows_corrected) == (None, None)
    # XIDs watched where the driver allows it: none yet ([]), not watched (None)
    assert (a.xid_events, b.xid_events, c.xid_events) == ([], [], None)
    assert fake.calls == ["init", "free 2"]  # NVML started once; the refused event set freed


def test_nvml_xids_are_reported_once_with_their_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, s = sampler(monkeypatch, TELEMETRY_DEVICES)
    s.sample(set())
    fake.raise_xid(1, 79)
    fake.raise_xid(1, 1, kind=2)  # another kind of event: not an XID
    fake.raise_xid(0, 48)
    fake.raise_xid(0, 63)
    a, b, _c = s.sample(set())
    assert [(e.xid, e.at) for e in a.xid_events or []] == [(48, NOW), (63, NOW)]
    assert [e.xid for e in b.xid_events or []] == [79]
    a, b, _c = s.sample(set())
    assert (a.xid_events, b.xid_events) == ([], [])  # read once
    for xid in range(100):  # a storm: the newest ones, bounded
        fake.raise_xid(0, xid)
    a, _b, _c = s.sample(set())
    assert [e.xid for e in a.xid_events or []] == list(range(100 - limits.XID_EVENTS, 100))
    assert fake.calls == ["init", "free 2"]  # once per sampler, not per heartbeat
    s.close()
    assert fake.calls == ["init", "free 2", "free 0", "free 1", "shutdown"]


def test_nvml_failing_queries_give_none(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, s = sampler(monkeypatch, TELEMETRY_DEVICES[:1])

    def lost(*args: Any) -> Any:
        raise FakeNVMLError("GPU is lost")

    for name in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPages",
        "nvmlEventSetWait",
    ):
        setattr(fake, name, lost)
    (a,) = s.sample(set())
    assert (a.utilization_pct, a.memory_used_mb, a.temperature_c) == (None, None, 41)
    assert (a.ecc_volatile_uncorrected, a.retired_pages, a.xid_events) == (None, None, [])


def test_nvml_not_started_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, s = sampler(monkeypatch, TELEMETRY_DEVICES[:2])
    started = fake.nvmlInit

    def no_driver() -> None:
        raise FakeNVMLError("Driver Not Loaded")

    fake.nvmlInit = no_driver
    assert [(x.index, x.temperature_c) for x in s.sample(set())] == [(0, None), (1, None)]
    fake.nvmlInit = started
    assert [x.temperature_c for x in s.sample(set())] == [41, None]
    s.close()
    s.close()  # twice: harmless
    assert fake.calls.count("shutdown") == 1


def test_nvml_inventory_gets_the_nvml_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFLEET_SIMULATED_GPUS", raising=False)
    fake = nvml(TELEMETRY_DEVICES)
    monkeypatch.setattr("gpufleet_node_agent.host.inventory.pynvml", fake)
    monkeypatch.setattr(tel, "pynvml", fake)
    inv = read_inventory(AgentSettings(minion_id="m1", agent_state_dir=tmp_path))
    s = gpu_sampler(inv, tmp_path)
    assert isinstance(s, NvmlSampler) and s.indices == [0, 1, 2]
    assert [x.ecc_aggregate_corrected for x in s.sample(set())] == [40, 7, None]


# --- simulated GPUs --------------------------------------------------------------------


def sim_gpu(index: int) -> GpuInfo:
    return GpuInfo(
        index=index, uuid=f"GPU-sim-{index}", model="RTX 3090", nvml_name="x", memory_mb=24576
    )


def simulated(tmp_path: Path) -> SimulatedSampler:
    inv = Inventory(gpus=[sim_gpu(0), sim_gpu(1)], simulated=True, source="sim")
    s = gpu_sampler(inv, tmp_path, clock=lambda: NOW)
    assert isinstance(s, SimulatedSampler) and s.control == tmp_path / CONTROL_FILE
    return s


def test_simulated_gpus_follow_their_workers(tmp_path: Path) -> None:
    s = simulated(tmp_path)
    idle, _ = s.sample(set())
    assert idle.utilization_pct == 0 and idle.memory_used_mb == 0
    assert 28 <= (idle.temperature_c or 0) <= 32 and 14 <= (idle.power_w or 0) <= 26
    assert (idle.ecc_volatile_uncorrected, idle.retired_pages, idle.xid_events) == (0, 0, [])
    temps = [s.sample({0})[0].temperature_c or 0 for _ in range(8)]  # a worker on GPU 0
    assert temps[0] < temps[-1] and 68 <= temps[-1] <= 74  # it warms over a few heartbeats
    busy, other = s.sample({0})
    assert 90 <= (busy.utilization_pct or 0) <= 100 and (busy.memory_used_mb or 0) > 10_000
    assert (busy.power_w or 0) > 200 and other.utilization_pct == 0
    cooled = [s.sample(set())[0].temperature_c or 0 for _ in range(8)]
    assert cooled[-1] <= 32


def test_simulated_control_file_raises_a_temperature_and_injects_xids(tmp_path: Path) -> None:
    s = simulated(tmp_path)
    control = tmp_path / CONTROL_FILE
    control.write_text(
        json.dumps(
            {"gpus": {"1": {"temperature_c": 95, "ecc_aggregate_uncorrected": 3, "xid": [79]}}}
        )
    )
    a, b = s.sample(set())
    assert (b.temperature_c, b.ecc_aggregate_uncorrected) == (95, 3)
    assert [(e.xid, e.at) for e in b.xid_events or []] == [(79, NOW)]
    assert a.xid_events == [] and (a.temperature_c or 0) < 40
    _a, b = s.sample(set())
    assert b.temperature_c == 95 and b.xid_events == []  # the XID once, the rest while it says
    # written again: injected again (the same bytes too)
    st = control.stat()
    control.write_text(json.dumps({"gpus": {"1": {"temperature_c": 95, "xid": 79}}}))
    os.utime(control, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    _a, b = s.sample(set())
    assert [e.xid for e in b.xid_events or []] == [79]
    control.unlink()  # gone: simulated again
    _a, b = s.sample(set())
    assert (b.temperature_c or 0) < 40 and b.xid_events == []


def test_simulated_control_file_that_does_not_parse_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = simulated(tmp_path)
    control = tmp_path / CONTROL_FILE
    control.write_text("{not json")
    assert all((x.temperature_c or 0) < 40 for x in s.sample(set()))
    control.write_text(json.dumps({"gpus": {"0": {"temperature_c": "hot"}, "1": {"x": 1}}}))
    a, b = s.sample(set())
    assert (a.temperature_c or 0) < 40 and (b.temperature_c or 0) < 40
    assert "x" not in (b.model_extra or {})  # only GpuSample's fields are steered
    assert any("simulated telemetry" in r.getMessage() for r in caplog.records)
    assert any("GPU 0 ignored" in r.getMessage() for r in caplog.records)


# --- the host: CPU, RAM, disk ----------------------------------------------------------


def test_host_sampler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(
        "MemTotal: 16384000 kB\nMemFree: 1 kB\nMemAvailable: 8192000 kB\n"
    )
    (proc / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3\n")
    asked: list[str] = []

    def usage(path: str) -> Any:
        asked.append(path)
        return types.SimpleNamespace(
            percent=42.5, free=123_456_789_012, used=91_358_024_000, total=214_814_813_012
        )

    fake = types.SimpleNamespace(
        disk_usage=usage,
        disk_io_counters=lambda: types.SimpleNamespace(read_bytes=1024, write_bytes=2048),
    )
    monkeypatch.setattr(tel, "psutil", fake)
    h = HostSampler(proc, disk=tmp_path)
    (proc / "stat").write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")
    x = h.sample()
    assert x.cpu_pct == 50.0 and x.ram_used_mb == (16384000 - 8192000) // 1024
    assert (x.disk_used_pct, x.disk_free_gb) == (42.5, 123.5) and asked == [str(tmp_path)]
    assert (x.disk_read_bytes, x.disk_write_bytes) == (1024, 2048)
    assert (x.disk_used_bytes, x.disk_total_bytes) == (91_358_024_000, 214_814_813_012)
    assert x.ram_total_mb == 16384000 // 1024
    assert tel.ram_mb(tmp_path / "missing") is None


def test_host_sampler_without_disks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(path: str) -> Any:
        raise FileNotFoundError(path)

    monkeypatch.setattr(
        tel, "psutil", types.SimpleNamespace(disk_usage=gone, disk_io_counters=lambda: None)
    )
    x = HostSampler(tmp_path / "proc", disk=tmp_path / "missing").sample()
    assert (x.disk_used_pct, x.disk_free_gb, x.disk_read_bytes, x.disk_write_bytes) == (None,) * 4
    assert (x.cpu_pct, x.ram_used_mb, x.ram_total_mb) == (None, None, None)
    assert (x.disk_used_bytes, x.disk_total_bytes) == (None, None)


def test_host_sampler_on_this_machine(tmp_path: Path) -> None:
    x = HostSampler(disk=tmp_path).sample()
    assert x.ram_used_mb is None or x.ram_used_mb > 0
    assert x.disk_used_pct is not None and 0 <= x.disk_used_pct <= 100
    assert x.disk_free_gb is not None and x.disk_free_gb >= 0


def test_an_old_agents_heartbeat_stays_valid() -> None:
    hb = NodeHeartbeat.model_validate(
        {
            "minion_id": "old",
            "at": NOW.isoformat(),
            "gpus": [{"index": 0, "utilization_pct": 3}],
            "cpu_pct": 1.0,
        }
    )
    g = hb.gpus[0]
    assert (g.ecc_volatile_corrected, g.retired_pages, g.xid_events) == (None, None, None)
    assert (hb.disk_used_pct, hb.disk_read_bytes) == (None, None)
