"""`run_service`: what every service's `__main__` does (cosmicpython's bootstrap).

It reads the bus settings from the environment, lets the process obtain its credential
first if it has to (the node agent exchanges a join token), connects the broker and the
store, builds the service from its ports and runs it until it is told to stop.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet_contracts.clock import configured_clock
from gpufleet_store import Store

from .broker import BusSettings, make_broker
from .wiring import Ports, Service

Build = Callable[[Ports], Service[Any]]


class StartError(Exception):
    """A process that cannot start as configured: its message is printed, exit status 2."""


def run_service(
    service: str,
    build: Build,
    *,
    uses_store: bool = True,
    credential: Callable[[BusSettings], Awaitable[BusSettings]] | None = None,
    dead_letters_as: str | None = None,
    exit_check_s: float = 0.1,
) -> None:
    """`exit_check_s`: how often FastStream's run loop looks whether it was told to stop (a
    wake-up each time, even idle: the node agent, of which a fleet has hundreds, checks
    every second rather than ten times a second)."""

    async def main() -> None:
        bus = BusSettings()
        try:
            clock = configured_clock()  # GPUFLEET_CLOCK_OFFSET_S, development only
        except ValueError as exc:
            raise StartError(str(exc)) from exc
        if credential is not None:
            bus = await credential(bus)
        broker = make_broker(service, bus, dead_letters_as=dead_letters_as)
        store = Store.connect(service) if uses_store else None
        await build(Ports(broker=broker, store=store, bus=bus, clock=clock)).app.run(
            sleep_time=exit_check_s
        )

    try:
        asyncio.run(main())
    except StartError as exc:
        print(f"gpufleet {service}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
