"""`DeviceSettings`: what the device agent is configured with (`GPUFLEET_*`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gpufleet_contracts.devices import DeviceModel
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DeviceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    minion_id: str
    device_state_dir: Path = Path("/var/lib/gpufleet/device")
    # podman: the configuration's image with the SoC's GPU (CDI) and video devices;
    # simulated: its start command as a host process, for tests and development
    device_runtime: Literal["podman", "simulated"] = "podman"
    # the Jetson model (GPUFLEET_DEVICE_MODEL to the command); what a simulated one plays
    device_profile: DeviceModel = DeviceModel.orin_nx
    # the boot id tells a reboot (the command runs again) from an agent restart
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    device_watch_s: float = 1.0
    heartbeat_s: float = Field(default=15.0, gt=0, le=3600)  # its heartbeat's period
    # a command that exits within this of its start failed its deployment (status != 0)
    device_start_grace_s: float = Field(default=3.0, ge=0)
    # the configuration's regional datastore, mounted as a node agent's are (mounts/):
    # `kernel` (NFS/SMB) or `bind` (`<datastore_bind_root>/<address>/<root path>`, tests)
    datastore_mounter: Literal["kernel", "bind"] = "kernel"
    datastore_bind_root: Path | None = None
    datastore_probe_s: float = Field(default=20.0, gt=0)
    datastore_probe_timeout_s: float = Field(default=10.0, gt=0)
    # the CA the platform store's certificate is checked with (its checkpoints), if not a
    # public one's (the node agent's GPUFLEET_STAGING_CA_FILE)
    staging_ca_file: Path | None = None
    join_token: str | None = Field(default=None, repr=False)

    def boot_id(self) -> str:
        return self.boot_id_file.read_text().strip()
