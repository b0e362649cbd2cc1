"""A short seeded chaos run (chaos.py; `just chaos` runs longer ones): 70 s of steady load
under a random mix of kill -9 and SIGSTOP faults, then every figure zero. Seed 277's first
70 s pause the scheduler past its lease (its standby takes over) and the node agent past its
lost threshold, kill MongoDB twice and the provisioner once, and pause NATS."""

from __future__ import annotations

import json

from . import chaos
from .conftest import System

SEED = 277  # any seed must pass; a fixed one keeps the suite reproducible
SECONDS = 70


def test_the_schedule_is_a_function_of_the_seed() -> None:
    assert chaos.schedule(SEED, 120) == chaos.schedule(SEED, 120)
    assert chaos.schedule(SEED, 120) != chaos.schedule(SEED + 1, 120)
    assert {f.kind for f in chaos.schedule(SEED, 600)} == {"kill", "pause"}
    # Some pauses outlast the scheduler's lease and the node's lost threshold (10 s each).
    long = {f.target for f in chaos.schedule(SEED, 600) if f.kind == "pause" and f.hold_s > 10}
    assert long == {"scheduler", "node-agent"}


def test_a_short_chaos_run_breaks_no_invariant(fresh_system: System) -> None:
    figures = chaos.run(fresh_system, seconds=SECONDS, seed=SEED)
    assert figures["_details"]["jobs acked"] > 0
    assert chaos.failures(figures) == {}, json.dumps(figures, indent=2)
