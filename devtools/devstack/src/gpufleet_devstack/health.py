"""Is the stack up: every service's health RPC, the node agent's heartbeats, and the table of
what answered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, Final

from gpufleet_contracts import subjects

from gpufleet_devstack import identities
from gpufleet_devstack.children import CONSOLE, NODE_NAME
from gpufleet_devstack.console import rel
from gpufleet_devstack.stack import SUPERVISE_INTERVAL, Stack, Supervised

HEALTH_TIMEOUT: Final = 60.0


def health_subject(service: str) -> str:
    """Asked as the local account (any account may ask a service's health)."""
    return subjects.as_account(subjects.rpc(service, "health"), identities.LOCAL_ACCOUNT)


def heartbeat_subject(minion_id: str) -> str:
    return subjects.heartbeat(minion_id)


async def _wait_healthy(nc: Any, child: Supervised, deadline: float) -> bool:
    assert child.spec.health is not None
    subject = health_subject(child.spec.health)
    loop = asyncio.get_running_loop()
    while loop.time() < deadline and not child.gave_up:
        try:
            await nc.request(subject, b"{}", timeout=1)
            return True
        except Exception:
            # no responders yet (NoRespondersError) or a slow start (TimeoutError)
            await asyncio.sleep(0.2)
    return False


async def check_health(stack: Stack, wait_s: float = HEALTH_TIMEOUT) -> dict[str, str]:
    """Ask every service its health RPC; the node agent counts as up when it heartbeats."""
    import nats

    status: dict[str, str] = {}
    nc = await nats.connect(
        stack.nats.url,
        connect_timeout=5,
        max_reconnect_attempts=-1,
        **stack.nats.admin(acting_for=identities.LOCAL_ACCOUNT),  # health_subject's account
    )
    try:
        heartbeats: set[str] = set()

        async def on_heartbeat(msg: Any) -> None:
            heartbeats.add(msg.subject)

        hb_sub = await nc.subscribe(heartbeat_subject(NODE_NAME), cb=on_heartbeat)
        deadline = asyncio.get_running_loop().time() + wait_s
        checked = [c for c in stack.children if c.spec.health is not None]

        async def supervise() -> None:
            while True:
                stack.supervise_once()
                await asyncio.sleep(SUPERVISE_INTERVAL)

        supervisor = asyncio.create_task(supervise())
        try:
            results = await asyncio.gather(*(_wait_healthy(nc, c, deadline) for c in checked))
        finally:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        for child, healthy in zip(checked, results, strict=True):
            status[child.spec.name] = "up" if healthy else "DOWN"
        await hb_sub.unsubscribe()
        for child in stack.children:
            if child.spec.health is None:
                if not child.process.alive:
                    status[child.spec.name] = "DOWN"
                elif child.spec is CONSOLE:
                    listening = await _listening(stack.console_url, deadline)
                    status[child.spec.name] = "up" if listening else "DOWN"
                elif heartbeats:
                    status[child.spec.name] = "up (heartbeating)"
                else:
                    status[child.spec.name] = "up (no heartbeat yet)"
    finally:
        await nc.close()
    return status


async def _listening(url: str, deadline: float) -> bool:
    """Whether the web console accepts connections at `url` (http://host:port) by `deadline`."""
    host, _, port = url.removeprefix("http://").partition(":")
    loop = asyncio.get_running_loop()
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 1.0)
        except (OSError, TimeoutError):
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.3)
            continue
        writer.close()
        return True


def print_status(stack: Stack, status: Mapping[str, str]) -> None:
    """One row a component: its state, and where to look (an address, or its log)."""
    rows: list[list[str]] = [
        ["nats-server", "up", stack.nats.url],
        ["mongodb (nx-27017)", "up", f"mongodb://{stack.mongo.host}:{stack.mongo.port}"],
    ]
    if stack.registry is not None:
        rows.append(["image registry", "up", f"http://{stack.registry.address}"])
    for child in stack.children:
        state = status.get(child.spec.name, "DOWN")
        where = stack.console_url if child.spec is CONSOLE else rel(child.process.log_file)
        rows.append([child.spec.name, state, where])
    if stack.prometheus is not None:
        state = "up" if stack.prometheus.running else "DOWN"
        rows.append(["prometheus (metrics history)", state, stack.prometheus.url])
    stack.out.table("gpufleet local stack", ["component", "state", "address or log"], rows)
