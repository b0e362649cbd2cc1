"""The device's heartbeat, like a compute node's (core NATS, on its own subject
`hb.device.<minion_id>`): its host's CPU, RAM and the disk of its state directory (/proc and
psutil, the node agent's HostSampler), and its SoC GPU: plausible values of the Jetson model
a simulated device plays; none on a real Jetson (it has no NVML)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpufleet_contracts.clock import Clock
from gpufleet_contracts.devices import DeviceHeartbeat, DeviceModel, DeviceTelemetry
from gpufleet_contracts.nodes import GpuSample

from ..host.telemetry import HostSampler
from .settings import DeviceSettings

log = logging.getLogger("gpufleet.node_agent.device")
Send = Callable[[DeviceHeartbeat], Awaitable[object]]

# each model's memory (shared by its CPU and GPU) and its power when idle and when busy
JETSON: dict[DeviceModel, tuple[int, float, float]] = {
    DeviceModel.agx_xavier: (32768, 10.0, 30.0),
    DeviceModel.xavier_nx: (8192, 5.0, 15.0),
    DeviceModel.agx_orin: (65536, 15.0, 60.0),
    DeviceModel.orin_nx: (16384, 10.0, 25.0),
    DeviceModel.orin_nano: (8192, 7.0, 15.0),
}


def soc_sample(model: DeviceModel, busy: bool) -> GpuSample:
    """A simulated SoC GPU: idle, or running the inference command."""
    memory_mb, idle_w, busy_w = JETSON[model]
    return GpuSample(
        index=0,
        utilization_pct=85 if busy else 0,
        memory_used_mb=memory_mb // 4 if busy else 0,
        temperature_c=61 if busy else 38,
        power_w=busy_w if busy else idle_w,
    )


class Heartbeat:
    """Builds and sends the heartbeat; `busy` says whether the command runs now."""

    def __init__(
        self, settings: DeviceSettings, send: Send, clock: Clock, busy: Callable[[], bool]
    ) -> None:
        self.settings = settings
        self.send = send
        self.clock = clock
        self.busy = busy
        self.host = HostSampler(disk=settings.device_state_dir)
        self.seq = 0

    def sample(self) -> DeviceHeartbeat:
        host = self.host.sample()
        simulated = self.settings.device_runtime == "simulated"
        self.seq += 1
        return DeviceHeartbeat(
            minion_id=self.settings.minion_id,
            at=self.clock(),
            seq=self.seq,
            period_s=self.settings.heartbeat_s,
            telemetry=DeviceTelemetry(
                cpu_pct=host.cpu_pct,
                ram_used_mb=host.ram_used_mb,
                ram_total_mb=host.ram_total_mb,
                disk_used_pct=host.disk_used_pct,
                disk_free_gb=host.disk_free_gb,
                gpu=soc_sample(self.settings.device_profile, self.busy()) if simulated else None,
            ),
        )

    async def beat(self) -> None:
        """One heartbeat; one not sent is logged (the next is on time)."""
        try:
            await self.send(await asyncio.to_thread(self.sample))
        except Exception as exc:
            log.warning("heartbeat not sent: %s", exc)
