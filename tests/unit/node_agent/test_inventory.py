"""Node agent: settings and GPU inventory (NVML, none without a driver, or simulated);
telemetry is tests/unit/node_agent/test_telemetry.py."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from gpufleet_node_agent.host import inventory as inv_mod
from gpufleet_node_agent.host.inventory import read_inventory
from gpufleet_node_agent.host.telemetry import NoGpus, gpu_sampler
from gpufleet_node_agent.settings import (
    AgentSettings,
    default_minion_id,
    default_sim_inventory,
    retired_settings,
    simulated_gpus_file,
)
from pydantic import ValidationError


@pytest.fixture(autouse=True)
def _no_simulated_gpus_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests choose NVML or simulation themselves, whatever the shell exported."""
    monkeypatch.delenv("GPUFLEET_SIMULATED_GPUS", raising=False)


# --- settings ------------------------------------------------------------------------


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPUFLEET_MINION_ID", "GPUFLEET_NODE_NAME", "GPUFLEET_AGENT_STATE_DIR"):
        monkeypatch.delenv(var, raising=False)
    s = AgentSettings(minion_id="gpu-01")
    assert s.node_name == "gpu-01"
    assert s.region == "local" and s.account == "local"
    assert s.heartbeat_s == 5.0 and s.log_chunk_bytes == 16384
    assert s.price_per_gpu_hour is None and s.simulated_gpus is None
    assert s.agent_state_dir == Path("~/.local/state/gpufleet-agent").expanduser()


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUFLEET_MINION_ID", "lab_box-7")
    monkeypatch.setenv("GPUFLEET_NODE_NAME", "Lab box 7")
    monkeypatch.setenv("GPUFLEET_PRICE_PER_GPU_HOUR", "0.35")
    monkeypatch.setenv("GPUFLEET_SIMULATED_GPUS", "true")
    monkeypatch.setenv("GPUFLEET_AGENT_STATE_DIR", str(tmp_path))
    s = AgentSettings()
    assert (s.minion_id, s.node_name, str(s.price_per_gpu_hour)) == (
        "lab_box-7",
        "Lab box 7",
        "0.35",
    )
    assert s.simulated_gpus == default_sim_inventory() and s.agent_state_dir == tmp_path


@pytest.mark.parametrize("on", ["1", "true", "TRUE", "yes", "on", " 1 "])
def test_simulated_gpus_on_means_the_packaged_file(on: str) -> None:
    packaged = simulated_gpus_file(on)
    assert packaged is not None and packaged.name == "2x-rtx3090.json" and packaged.is_file()


@pytest.mark.parametrize("off", [None, "", "0", "false", "No", "off"])
def test_simulated_gpus_off(off: str | None) -> None:
    assert simulated_gpus_file(off) is None


def test_simulated_gpus_names_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = tmp_path / "gpus.json"
    f.write_text("[]")
    monkeypatch.setenv("GPUFLEET_SIMULATED_GPUS", str(f))
    assert AgentSettings(minion_id="m1").simulated_gpus == f
    monkeypatch.setenv("GPUFLEET_SIMULATED_GPUS", str(tmp_path / "missing.json"))
    with pytest.raises(ValidationError, match="neither on/off"):
        AgentSettings(minion_id="m1")


def test_the_retired_settings_are_named() -> None:
    env = {"GPUFLEET_FORCE_SIMULATED": "1", "GPUFLEET_REGION": "eu"}
    assert retired_settings(env) == ["GPUFLEET_FORCE_SIMULATED"]
    assert retired_settings({"GPUFLEET_SIMULATED_GPUS": "1"}) == []


@pytest.mark.parametrize("bad", ["a.b", "a b", "a*", "", "a>", "x" * 65])
def test_minion_id_must_be_a_subject_token(bad: str) -> None:
    with pytest.raises(ValidationError, match="minion_id"):
        AgentSettings(minion_id=bad)


def test_default_minion_id_is_subject_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "gpu-01.lab.example")
    assert default_minion_id() == "gpu-01-lab-example"


# --- simulated inventory, or no GPUs without a driver ---------------------------------


def _settings(tmp_path: Path, **kw: Any) -> AgentSettings:
    return AgentSettings(minion_id="m1", agent_state_dir=tmp_path, **kw)


def _check_simulated(inv: inv_mod.Inventory) -> None:
    assert inv.simulated is True
    assert inv.source == str(default_sim_inventory())
    assert [g.index for g in inv.gpus] == [0, 1]
    for g in inv.gpus:
        assert g.model == "RTX 3090"
        assert g.nvml_name == "NVIDIA GeForce RTX 3090"
        assert g.memory_mb == 24576 and (g.pcie_gen, g.pcie_width) == (4, 16)
        assert g.uuid.startswith("GPU-sim-3090-")
    assert len({g.uuid for g in inv.gpus}) == 2


def test_simulated_gpus_never_ask_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_init() -> None:
        raise AssertionError("NVML must not be touched when GPUs are simulated")

    monkeypatch.setattr(pynvml, "nvmlInit", must_not_init)
    inv = read_inventory(_settings(tmp_path, simulated_gpus=True))
    _check_simulated(inv)
    assert "GPUFLEET_SIMULATED_GPUS" in inv.note and "SIMULATED" in inv.describe()


def _sys_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal: 2048000 kB\n")
    return root


def test_no_driver_means_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    inv = read_inventory(_settings(tmp_path), _sys_root(tmp_path))
    assert inv.gpus == [] and inv.simulated is False and inv.driver_version is None
    assert inv.source == "nvml: no NVIDIA driver (Driver Not Loaded)"
    assert inv.hardware is not None and inv.hardware.memory_mb == 2000  # the OS is still read
    assert inv.describe() == (
        "no GPUs (nvml: no NVIDIA driver (Driver Not Loaded)): this node takes no GPU work"
    )
    # no NVML call at each heartbeat (it would fail every time)
    assert isinstance(gpu_sampler(inv, tmp_path), NoGpus)


def test_no_nvml_library_means_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(pynvml, "nvmlInit", broken)
    inv = read_inventory(_settings(tmp_path), _sys_root(tmp_path))
    assert inv.gpus == [] and not inv.simulated
    assert inv.source.startswith("nvml: no NVIDIA driver (libnvidia-ml.so.1")


def test_custom_simulated_file(tmp_path: Path) -> None:
    f = tmp_path / "one-h100.json"
    f.write_text(
        '[{"index": 0, "uuid": "GPU-x", "nvml_name": "NVIDIA H100 80GB HBM3",'
        ' "memory_mb": 81559, "pcie_gen": 5, "pcie_width": 16}]'
    )
    inv = read_inventory(_settings(tmp_path, simulated_gpus=f))
    assert [(g.model, g.memory_mb) for g in inv.gpus] == [("H100 80GB", 81559)]
    assert inv.simulated and inv.source == str(f)


# --- NVML, through a fake pynvml -------------------------------------------------------


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeFunctionNotFound(FakeNVMLError):
    pass


def fake_pynvml(devices: list[dict[str, Any]]) -> types.SimpleNamespace:
    calls: list[str] = []

    def dev(h: int) -> dict[str, Any]:
        return devices[h]

    def maybe(h: int, key: str) -> Any:
        value = dev(h).get(key)
        if value is None:
            raise FakeNotSupported()
        return value

    return types.SimpleNamespace(
        calls=calls,
        NVMLError=FakeNVMLError,
        NVMLError_NotSupported=FakeNotSupported,
        NVMLError_FunctionNotFound=FakeFunctionNotFound,
        NVML_DEVICE_MIG_ENABLE=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: dev(h)["name"],
        nvmlDeviceGetUUID=lambda h: dev(h)["uuid"],
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            total=dev(h)["mem_mb"] * 1024 * 1024, used=dev(h)["used_mb"] * 1024 * 1024
        ),
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: maybe(h, "gen"),
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: maybe(h, "width"),
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 1,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: maybe(h, "width"),
        nvmlDeviceGetMigMode=lambda h: [maybe(h, "mig"), 0],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=dev(h)["util"]),
        nvmlDeviceGetTemperature=lambda h, sensor: maybe(h, "temp"),
        nvmlDeviceGetPowerUsage=lambda h: maybe(h, "power_mw"),
    )


DEVICES = [
    {
        "name": "NVIDIA GeForce RTX 3090",
        "uuid": "GPU-aaaa",
        "mem_mb": 24576,
        "used_mb": 100,
        "gen": 4,
        "width": 16,
        "mig": None,
        "util": 7,
        "temp": 41,
        "power_mw": 30500,
    },
    {
        "name": b"NVIDIA A100-SXM4-80GB",
        "uuid": b"GPU-bbbb",
        "mem_mb": 81920,
        "used_mb": 0,
        "gen": 4,
        "width": 16,
        "mig": 1,
        "util": 0,
        "temp": None,
        "power_mw": None,
    },
    {
        "name": "NVIDIA Mystery GPU",
        "uuid": "GPU-cccc",
        "mem_mb": 1024,
        "used_mb": 0,
        "gen": None,
        "width": None,
        "mig": 0,
        "util": 0,
        "temp": 30,
        "power_mw": 1000,
    },
]


def test_nvml_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml(DEVICES)
    monkeypatch.setattr(inv_mod, "pynvml", fake)
    inv = read_inventory(_settings(tmp_path))
    assert inv.simulated is False and inv.source == "nvml"
    assert inv.driver_version == "550.54.15"
    assert fake.calls == ["init", "shutdown"]
    a, b, c = inv.gpus
    assert (a.index, a.uuid, a.model, a.nvml_name, a.memory_mb) == (
        0,
        "GPU-aaaa",
        "RTX 3090",
        "NVIDIA GeForce RTX 3090",
        24576,
    )
    assert (a.pcie_gen, a.pcie_width, a.mig_mode) == (4, 16, None)
    assert (b.uuid, b.model, b.nvml_name, b.mig_mode) == (
        "GPU-bbbb",
        "A100 80GB",
        "NVIDIA A100-SXM4-80GB",
        True,
    )
    assert (c.model, c.pcie_gen, c.pcie_width, c.mig_mode) == (None, None, None, False)
    assert "real GPUs via NVML (3)" in inv.describe()


def test_nvml_shutdown_even_when_a_query_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_pynvml(DEVICES)

    def lost(h: int) -> str:
        raise FakeNVMLError("GPU is lost")

    fake.nvmlDeviceGetUUID = lost
    monkeypatch.setattr(inv_mod, "pynvml", fake)
    # NVML works but a GPU misbehaves: report the fault, never pretend to be simulated.
    with pytest.raises(FakeNVMLError):
        inv_mod.read_nvml()
    assert fake.calls == ["init", "shutdown"]
    inv = read_inventory(_settings(tmp_path), _sys_root(tmp_path))
    assert inv.gpus == [] and inv.simulated is False
    assert inv.source == "nvml: reading the GPUs failed (GPU is lost)"


# --- hardware inventory (R-NODE-4) from the OS, or from the simulated file ----------------


def _sysfs(root: Path) -> None:
    def put(rel: str, text: str) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    tb = 1_000_204_886_016 // 512  # a "1 TB" drive, in 512-byte sectors
    for name in ("nvme0n1", "nvme1n1"):
        put(f"sys/block/{name}/size", f"{tb}\n")
        put(f"sys/block/{name}/queue/rotational", "0\n")
    put("sys/block/sda/size", f"{2 * tb}\n")
    put("sys/block/sda/queue/rotational", "1\n")
    put("sys/block/loop0/size", "1024\n")  # not a disk
    put("sys/class/tpm/tpm0/tpm_version_major", "2\n")
    put("sys/class/net/eth0/speed", "10000\n")
    (root / "sys/class/net/eth0/device").mkdir(parents=True)
    put("sys/class/net/eth1/speed", "-1\n")  # link down
    (root / "sys/class/net/eth1/device").mkdir(parents=True)
    put("sys/class/net/lo/speed", "0\n")
    put("sys/class/net/docker0/speed", "10000\n")  # virtual: no device
    put("proc/meminfo", "MemTotal:       131072000 kB\nMemAvailable:   1000 kB\n")


def test_hardware_from_sysfs(tmp_path: Path) -> None:
    _sysfs(tmp_path)
    hw = inv_mod.read_hardware(tmp_path)
    assert [(d.name, d.kind, d.size_gb, d.rotational) for d in hw.drives] == [
        ("nvme0n1", "nvme", 1000, False),
        ("nvme1n1", "nvme", 1000, False),
        ("sda", "sata", 2000, True),
    ]
    assert hw.tpm_version == "2.0"
    assert [(n.name, n.speed_mbps) for n in hw.nics] == [("eth0", 10000), ("eth1", None)]
    assert hw.memory_mb == 128000 and hw.cpu_cores and hw.gpu_form_factor == "pcie"


def test_no_tpm_and_old_tpm(tmp_path: Path) -> None:
    assert inv_mod.read_tpm(tmp_path / "missing") is None
    (tmp_path / "tpm0").mkdir()
    assert inv_mod.read_tpm(tmp_path) == "1.2"


def test_packaged_simulated_inventory_reports_hardware_that_passes(tmp_path: Path) -> None:
    inv = read_inventory(_settings(tmp_path, simulated_gpus=True))
    assert inv.hardware is not None and inv.hardware.tpm_version == "2.0"
    from gpufleet_provisioner.hardware import check_hardware

    assert check_hardware(inv.gpus, inv.hardware) == []


def test_a_list_inventory_file_reports_no_hardware(tmp_path: Path) -> None:
    f = tmp_path / "gpus.json"
    f.write_text('[{"index": 0, "uuid": "GPU-x", "nvml_name": "Tesla T4", "memory_mb": 15360}]')
    inv = read_inventory(_settings(tmp_path, simulated_gpus=f))
    assert inv.hardware is None and inv.gpus[0].model == "T4"
