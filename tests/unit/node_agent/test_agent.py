"""Node agent: registration, heartbeat and health built from settings and inventory."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pynvml
import pytest
from gpufleet_contracts import subjects
from gpufleet_contracts.health import HealthCheck
from gpufleet_contracts.nodes import NodeHeartbeat, RegisterNode
from gpufleet_node_agent.agent import Agent
from gpufleet_node_agent.settings import AgentSettings, default_sim_inventory

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


class NullBroker:
    async def publish(self, *args: Any, **kwargs: Any) -> None:
        return None


def agent(tmp_path: Path, simulated: bool = True, **kw: Any) -> Agent:
    s = AgentSettings(
        minion_id="box-1",
        node_name="Box one",
        region="eu",
        account="acme",
        simulated_gpus=default_sim_inventory() if simulated else None,
        agent_state_dir=tmp_path,
        price_per_gpu_hour=Decimal("0.4"),
        **kw,
    )
    return Agent(s, NullBroker(), clock=lambda: NOW)  # type: ignore[arg-type]


async def test_registration(tmp_path: Path) -> None:
    a = agent(tmp_path)
    await a.prepare()
    reg = a.registration()
    assert isinstance(reg, RegisterNode)
    assert reg.subject() == "gpufleet.v1.cmd.provisioner.box-1.register_node"
    assert (reg.minion_id, reg.name, reg.region, reg.owner) == ("box-1", "Box one", "eu", "acme")
    assert reg.simulated is True and reg.inventory_source.endswith("2x-rtx3090.json")
    assert [g.model for g in reg.gpus] == ["RTX 3090", "RTX 3090"]
    assert reg.price_per_gpu_hour == Decimal("0.4") and reg.agent_started_at == NOW
    assert a.workers.gpu_indices == {0, 1}
    # a GPU node offers no CPUs to CPU-only jobs unless its operator says so (R-JOB-2)
    assert (reg.cpu_job_cpus, reg.price_per_cpu_hour) == (0, None)


async def test_an_operator_offers_cpus_to_cpu_only_jobs(tmp_path: Path) -> None:
    a = agent(tmp_path, cpu_job_cpus=64, price_per_cpu_hour=Decimal("0.02"))
    await a.prepare()
    reg = a.registration()  # the simulated node has 16 logical CPUs: it offers all 16
    assert reg.hardware is not None and reg.hardware.cpu_cores == 16
    assert (reg.cpu_job_cpus, reg.price_per_cpu_hour) == (16, Decimal("0.02"))
    rt = a.workers.runtimes["podman"]
    assert (rt.node_cpus, rt.cpu_job_cpus) == (16, 16)  # type: ignore[attr-defined]


async def test_heartbeat_and_health(tmp_path: Path) -> None:
    a = agent(tmp_path)
    await a.prepare()
    hb = await a.heartbeat()
    assert isinstance(hb, NodeHeartbeat)
    assert hb.subject() == "gpufleet.v1.hb.box-1"
    assert (hb.minion_id, hb.at, hb.running) == ("box-1", NOW, [])
    assert [g.index for g in hb.gpus] == [0, 1]
    health = await a.health(HealthCheck())
    assert health.status == "ok" and health.minion_id == "box-1"
    assert health.simulated is True and health.gpus == 2
    assert subjects.node_health("box-1") == "gpufleet.v1.node.box-1.health"


async def test_heartbeat_carries_the_simulated_control_file_and_the_disk(tmp_path: Path) -> None:
    a = agent(tmp_path)
    await a.prepare()
    (tmp_path / "simulated-telemetry.json").write_text(
        json.dumps({"gpus": {"1": {"temperature_c": 95, "xid": [79]}}})
    )
    hb = await a.heartbeat()
    assert [(g.index, g.temperature_c) for g in hb.gpus][1] == (1, 95)
    assert [(e.xid, e.at) for e in hb.gpus[1].xid_events or []] == [(79, NOW)]
    assert hb.gpus[0].xid_events == [] and (hb.gpus[0].temperature_c or 0) < 40
    assert hb.disk_used_pct is not None and hb.disk_free_gb is not None  # tmp_path's filesystem
    hb = await a.heartbeat()
    assert hb.gpus[1].temperature_c == 95 and hb.gpus[1].xid_events == []  # reported once
    await a.stop()


async def test_without_a_driver_the_node_registers_with_no_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    monkeypatch.setenv("GPUFLEET_FORCE_SIMULATED", "1")  # retired: warned about, not obeyed
    a = agent(tmp_path, simulated=False)
    with caplog.at_level(logging.WARNING, logger="gpufleet.node_agent"):
        await a.prepare()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "GPUFLEET_FORCE_SIMULATED is no longer read; use GPUFLEET_SIMULATED_GPUS" in said
    assert any(m.startswith("node agent box-1: no GPUs (nvml: no NVIDIA driver") for m in said)
    reg = a.registration()
    assert (reg.gpus, reg.simulated, reg.driver_version) == ([], False, None)
    assert reg.hardware is not None and reg.cpu_job_cpus == reg.hardware.cpu_cores  # all
    assert reg.inventory_source.startswith("nvml: no NVIDIA driver")
    assert reg.hardware is not None  # the rest of the hardware is real and reported
    hb = await a.heartbeat()
    assert hb.gpus == [] and a.workers.gpu_indices == set()
    health = await a.health(HealthCheck())
    assert health.status == "ok" and health.simulated is False and health.gpus == 0
