"""An e2e system with the Google Cloud emulator: imported by the burst tests only.

`GcpSystem` is `System` (every process from `gpufleet_devstack.up.SERVICES`) plus the
emulator (`python -m gpufleet_gcp_emulator`), whose instances boot simulated node agents on
the same NATS; the services get the emulator's endpoints, a Fernet key and a short idle time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from gpufleet_gcp_emulator.testing import EmulatorProcess
from gpufleet_gcp_emulator.testing import service_account_key as emulated_key

from .conftest import BARE_OWN_JOBS, System

IDLE_S = 3


def service_account_key(project: str) -> str:
    return json.dumps(emulated_key(project, "e2e"))


class GcpSystem(System):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.secret = Fernet.generate_key().decode()
        self.emulator = EmulatorProcess(
            root / "logs" / "gcp-emulator.log",
            nats_url=self.nats.url,  # its instances' agents report here
            agent_dir=root / "gcp-agents",
            delay_s=0.3,
            agent_heartbeat_s=1.0,
            agent_env=BARE_OWN_JOBS,  # as the local node: the burst jobs are `local`'s
        )

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        env.update(
            GPUFLEET_SECRET_KEY=self.secret,
            GPUFLEET_PROVISIONER_TICK_S="0.5",
            GPUFLEET_BURST_IDLE_S=str(IDLE_S),
        )
        if self.emulator.compute:
            env.update(self.emulator.env())
        return env

    def start(self) -> None:
        self.emulator.start()  # first: the services need its endpoints
        super().start()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.emulator.stop()


@pytest.fixture(scope="module")
def gcp_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcpSystem]:
    system = GcpSystem(tmp_path_factory.mktemp("gcp-system"))
    try:
        system.start()
        yield system
    finally:
        system.stop()
