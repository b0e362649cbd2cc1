"""A NATS cluster of local nats-servers: the compose topology (three servers, R3 streams) in
miniature, for the fault tests.

Every member is a `NatsServer` with its own port, monitor port, route port and JetStream
store, and the same authority (operator, accounts, JetStream key): a credential minted by
one member is good on all of them. `url` lists every member, as the services get it in
compose (`GPUFLEET_NATS_URL`). A member killed and restarted keeps its ports and store, and
catches up from the others.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from gpufleet_devstack.nats import NatsServer
from gpufleet_devstack.processes import free_port, wait_for

__all__ = ["NatsCluster"]

CLUSTER_NAME = "gpufleet"


class NatsCluster:
    """`size` nats-servers routed to each other under `root` (`root/n1`, `root/n2`, ...)."""

    def __init__(self, root: Path, size: int = 3, host: str = "127.0.0.1", **member: Any) -> None:
        root = Path(root).absolute()
        self.host = host
        route_ports = [free_port(host) for _ in range(size)]
        routes = ", ".join(f"nats-route://{host}:{p}" for p in route_ports)
        auth_dir = root / "auth"
        self.members = [
            NatsServer(
                root / f"n{i + 1}",
                host=host,
                auth_dir=auth_dir,
                server_name=f"n{i + 1}",
                cluster=(
                    f"cluster {{\n  name: {CLUSTER_NAME}\n  listen: {host}:{route_ports[i]}\n"
                    f"  routes: [{routes}]\n}}\n"
                ),
                **member,
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        """Every member's URL, comma-separated (GPUFLEET_NATS_URL of a cluster)."""
        return ",".join(m.url for m in self.members)

    @property
    def servers(self) -> list[str]:
        return [m.url for m in self.members]

    def member(self, name: str) -> NatsServer:
        return next(m for m in self.members if m.server_name == name)

    def start(self, timeout: float = 60) -> None:
        """Start every member, then wait until JetStream has a meta leader."""
        for m in self.members:
            m.start()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 60) -> None:
        """Every running member says it is healthy (in step with the meta leader)."""
        wait_for(
            lambda: all(_healthy(m) for m in self.members if m.running),
            timeout=timeout,
            interval=0.2,
            message="the NATS cluster did not become healthy",
        )

    def stop(self) -> None:
        for m in reversed(self.members):
            m.stop()


def _healthy(member: NatsServer) -> bool:
    try:
        with urllib.request.urlopen(f"{member.monitor_url}/healthz", timeout=1) as resp:
            body = json.loads(resp.read() or b"{}")
            return bool(resp.status == 200 and body.get("status") == "ok")
    except (OSError, ValueError):
        return False
