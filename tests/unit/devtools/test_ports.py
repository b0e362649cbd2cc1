"""The local NATS server's ports (devtools/devstack): never the same port twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_devstack import NatsServer
from gpufleet_devstack import nats as nats_module

pytestmark = pytest.mark.unit


def test_the_monitor_port_is_never_the_client_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    handed = iter([4222, 4222, 8222])  # the kernel gives the client's port out again first
    monkeypatch.setattr(nats_module, "free_port", lambda host="127.0.0.1": next(handed))
    server = NatsServer(tmp_path / "store", port=4222)
    assert (server.port, server.monitor_port) == (4222, 8222)
