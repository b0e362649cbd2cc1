"""The device agent's heartbeat, on plain data: its own minion id and period, a sequence,
its host's figures, and the SoC GPU of the Jetson model a simulated device plays (busy while
its command runs); none on a real Jetson."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from gpufleet_contracts.devices import DeviceHeartbeat, DeviceModel
from gpufleet_node_agent.device.heartbeat import JETSON, Heartbeat, soc_sample
from gpufleet_node_agent.device.settings import DeviceSettings

AT = datetime(2026, 5, 1, tzinfo=UTC)


def beat(tmp_path: Path, runtime: str, busy: bool) -> Heartbeat:
    settings = DeviceSettings(
        minion_id="jx-1",
        device_state_dir=tmp_path,
        device_runtime=runtime,
        device_profile=DeviceModel.orin_nano,
        heartbeat_s=7.0,
    )

    async def send(hb: DeviceHeartbeat) -> None:
        return None

    return Heartbeat(settings, send, lambda: AT, lambda: busy)


def test_a_simulated_device_reports_its_host_and_its_soc_gpu(tmp_path: Path) -> None:
    hb = beat(tmp_path, "simulated", busy=True)
    first, second = hb.sample(), hb.sample()
    assert (first.minion_id, first.at, first.period_s) == ("jx-1", AT, 7.0)
    assert (first.seq, second.seq) == (1, 2)
    assert first.subject() == "gpufleet.v1.hb.device.jx-1"
    t = second.telemetry
    assert t.ram_total_mb and t.ram_used_mb is not None and t.disk_free_gb is not None
    assert t.cpu_pct is None or 0 <= t.cpu_pct <= 100  # None: no tick between two samples
    assert t.gpu == soc_sample(DeviceModel.orin_nano, busy=True)


def test_a_real_jetson_reports_no_gpu_sample(tmp_path: Path) -> None:
    assert beat(tmp_path, "podman", busy=True).sample().telemetry.gpu is None


@pytest.mark.parametrize("model", list(DeviceModel))
def test_the_soc_gpu_follows_the_command(model: DeviceModel) -> None:
    idle, busy = soc_sample(model, busy=False), soc_sample(model, busy=True)
    memory_mb, idle_w, busy_w = JETSON[model]
    assert (idle.utilization_pct, idle.memory_used_mb, idle.power_w) == (0, 0, idle_w)
    assert busy.utilization_pct and busy.power_w == busy_w
    assert 0 < (busy.memory_used_mb or 0) < memory_mb
