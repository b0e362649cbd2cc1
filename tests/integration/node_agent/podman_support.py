"""What the podman runtime's tests share: the containers.conf, a broker that records what a
worker manager publishes (these tests are about podman; the agent's NATS side is tested in
test_node_agent.py), the base image and a node whose containers are removed after a test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import WorkerFinished, WorkerStarted
from gpufleet_node_agent.baseimage import (
    BASE_IMAGE,
    default_containers_conf,
    ensure_image,
    podman_env,
)
from gpufleet_node_agent.runtimes.runc import DEFAULT_ROOT as runc_root
from gpufleet_node_agent.worker.manager import WorkerManager

CONF = default_containers_conf()


class Broker:
    """Records publishes, dropping a repeated Nats-Msg-Id as JetStream does."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def publish(
        self, message: bytes, subject: str, headers: dict[str, str] | None = None, **_: Any
    ) -> None:
        assert headers is not None
        if all(h["Nats-Msg-Id"] != headers["Nats-Msg-Id"] for _, _, h in self.sent):
            self.sent.append((subject, message, headers))

    def events(self, cls: type[Any]) -> list[Any]:
        return [cls.from_bytes(m) for _, m, h in self.sent if h["ce-type"] == cls.TYPE]


@pytest.fixture(scope="module")
def image() -> str:
    error = asyncio.run(ensure_image(BASE_IMAGE, podman_env(CONF)))
    assert error is None, error
    return BASE_IMAGE


@pytest.fixture
def minion() -> Iterator[str]:
    mid = f"pt-{uuid.uuid4().hex[:8]}"
    yield mid
    # whatever a failed test left of this node's containers
    ids = subprocess.run(
        ["podman", "ps", "-aq", "--filter", f"label=gpufleet.minion={mid}"],
        env=podman_env(CONF),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if ids:
        subprocess.run(
            ["podman", "rm", "-f", *ids], env=podman_env(CONF), capture_output=True, check=False
        )
    # and of the containers runc started (runc.py)
    runc = ["runc", "--root", str(runc_root)]
    listed = subprocess.run([*runc, "list", "--format", "json"], capture_output=True, check=False)
    for c in json.loads(listed.stdout or b"null") or []:
        if (c.get("annotations") or {}).get("gpufleet.minion") == mid:
            subprocess.run([*runc, "delete", "--force", c["id"]], capture_output=True, check=False)
    # and of those crun started: their cgroups are the agent's (cgroupv1.py)
    for bundle in Path("/run/gpufleet-agent/crun").glob("*/config.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(bundle.read_text())["annotations"].get("gpufleet.minion") == mid:
                subprocess.run(
                    [
                        "crun",
                        "--cgroup-manager=disabled",
                        "--root",
                        str(bundle.parent.parent),
                        "kill",
                        bundle.parent.name,
                        "KILL",
                    ],
                    capture_output=True,
                    check=False,
                )


def container_record(worker_dir: Path) -> dict[str, Any] | None:
    """{name, image} of a worker's container, whoever started it (runc.py or podman)."""
    for marker in ("runc.json", "container.json"):
        with contextlib.suppress(OSError):
            data: dict[str, Any] = json.loads((worker_dir / marker).read_text())
            return data
    return None


async def until_finished(m: WorkerManager, placement: str, within: float = 60) -> WorkerFinished:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        await m.poll_once()
        done = [e for e in m.broker.events(WorkerFinished) if e.placement_id == placement]  # type: ignore[attr-defined]
        if done:
            return done[0]  # type: ignore[no-any-return]
        await asyncio.sleep(0.1)
    raise AssertionError(f"worker {placement} did not finish in {within}s")


async def until_started(m: WorkerManager, placement: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        await m.poll_once()
        if any(e.placement_id == placement for e in m.broker.events(WorkerStarted)):  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"worker {placement} did not start in {within}s")
