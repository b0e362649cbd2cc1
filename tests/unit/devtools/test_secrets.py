"""The local stack's keys: one Fernet key for the provisioner and the scheduler, and the
JetStream key in the server's configuration, all 0600 (the server itself: integration)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from gpufleet_devstack import NatsServer, identities

pytestmark = pytest.mark.unit


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_provisioner_and_the_scheduler_share_the_stacks_key(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    envs = {s: identities.service_env(server, s) for s in ("provisioner", "scheduler", "billing")}
    key = envs["scheduler"]["GPUFLEET_SECRET_KEY"]
    assert envs["provisioner"]["GPUFLEET_SECRET_KEY"] == key
    assert "GPUFLEET_SECRET_KEY" not in envs["billing"]
    Fernet(key.encode())  # a Fernet key
    assert mode(server.auth_dir / "secret.key") == 0o600
    assert identities.secret_key(NatsServer(tmp_path / "nats")) == key  # kept


def test_a_key_of_the_earlier_gcp_layout_is_adopted(tmp_path: Path) -> None:
    old = tmp_path / "gcp-secret.key"
    old.write_text(Fernet.generate_key().decode())
    server = NatsServer(tmp_path / "nats")
    assert identities.secret_key(server, adopt=old) == old.read_text()


def test_the_jetstream_key_is_made_once_and_private(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    key = server.jetstream_key()
    assert len(key) == 64 and server.jetstream_key() == key
    assert mode(server.jetstream_key_file) == 0o600
