"""gpufleet_bus.periodic.Every: the one helper for a service's periodic work."""

from __future__ import annotations

import asyncio

from gpufleet_bus import Every


async def test_rounds_run_every_period_and_a_failed_round_does_not_stop_them() -> None:
    rounds: list[int] = []

    async def work() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            raise RuntimeError("database briefly away")

    every = Every(0.02, work, "test")
    every.start()
    await asyncio.sleep(0.15)
    await every.stop()
    assert len(rounds) >= 4  # the failed second round did not end the loop
    done = len(rounds)
    await asyncio.sleep(0.05)
    assert len(rounds) == done  # stopped


async def test_the_first_round_waits_a_period_unless_at_start() -> None:
    ran: list[str] = []

    async def a() -> None:
        ran.append("a")

    async def b() -> None:
        ran.append("b")

    now, later = Every(10, a, "now"), Every(10, b, "later", at_start=False)
    now.start()
    later.start()
    await asyncio.sleep(0.05)
    await now.stop()
    await later.stop()  # the wait between rounds ends at once
    assert ran == ["a"]


async def test_stop_lets_the_round_in_hand_finish_within_its_grace() -> None:
    finished: list[bool] = []

    async def settle() -> None:
        await asyncio.sleep(0.1)
        finished.append(True)

    every = Every(10, settle, "settle", grace_s=2)
    every.start()
    await asyncio.sleep(0.02)
    await every.stop()
    assert finished == [True]


async def test_a_round_longer_than_its_grace_is_cancelled() -> None:
    cancelled: list[bool] = []

    async def stuck() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    every = Every(10, stuck, "stuck", grace_s=0.05)
    every.start()
    await asyncio.sleep(0.02)
    await every.stop()
    assert cancelled == [True]
