"""Seeded chaos against the whole system: `just chaos [--seconds N] [--seed S]`.

It starts the system as the e2e tests do (tests/e2e/conftest.py's System: nats-server,
nx-27017, the five services, one simulated node agent), keeps a steady job load on it
(short `sleep` jobs submitted through the CLI, one after another), and meanwhile applies a
random mix of faults drawn from the seed: kill -9 of a service, of the node agent, of
nats-server or of the database (each restarted after a moment), SIGSTOP/SIGCONT of one
of them for a few seconds, and long pauses (12-16 s) of the scheduler or the node agent,
past the scheduler's lease (10 s) and the node's lost threshold (10 s): the scheduler,
resumed, finds its lease lapsed and takes it again before it places; a paused agent's node
is marked lost and its workers requeued, and when it resumes its old workers are stopped.
One scheduler runs, as under `just up`: two scheduler processes on nx-27017 meet its
"two transactions at once" gap (docs/nx-27017-gaps.md; a seed-2 run with a standby saw
"no such savepoint", and two jobs stored finished whose stream says running); a leader replaced
by a standby is tests/e2e/test_pauses.py's. Then it waits for every acknowledged job to
end and prints the invariants as figures (invariants.py, replay.py read them from the
system itself):

    acked jobs lost     acknowledged submissions the scheduler does not have
    GPUs given twice    pairs of workers of different jobs on one GPU at overlapping times
    double charges      ledger charges beyond one per started run
    ledger drift        charge groups not summing to zero, and the CLI's balance vs the entries
    jobs stuck          acknowledged jobs not ended when the run's deadline came
    state drift         jobs and nodes whose stored state differs from their event history

The schedule is a pure function of the seed and the duration (`schedule`): the seed and
the schedule are printed first, so a failing run is reproduced with the same `--seed` and
`--seconds` (the machine's timing still varies). Faults are half kills, three tenths short
pauses (2-6 s), two tenths long ones (tests/e2e/test_pauses.py tests each long pause alone).
Exit status 0 when every figure is zero, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .conftest import System
from .invariants import charges_per_job, gpus_given_twice, ledger_drift, stream_events
from .invariants import unpublished_outbox as outbox
from .replay import (
    job_states_from_events,
    node_states_from_events,
    state_drift,
    stored_job_states,
    stored_node_states,
)

SERVICES = ("scheduler", "billing", "provisioner", "device-fleet", "datastore")
KILLABLE = (*SERVICES, "node-agent", "nats", "mongo")
PAUSABLE = ("scheduler", "billing", "provisioner", "node-agent", "nats", "mongo")
# Long pauses: past the scheduler's lease (10 s; the standby takes over) and the node's lost
# threshold (10 s; its workers are requeued and, when it resumes, its old ones stopped).
LONG_PAUSABLE = ("scheduler", "node-agent")
LONG_PAUSE_S = (12.0, 16.0)
ENDED = {"finished", "failed", "cancelled", "stopped", "rejected"}


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the load started
    kind: str  # "kill" (kill -9, restarted after `hold_s`) or "pause" (SIGSTOP for `hold_s`)
    target: str
    hold_s: float


def schedule(seed: int, seconds: float) -> list[Fault]:
    """The faults of a run: one every 8-20 s, from 5 s in until 10 s before the end."""
    rng = random.Random(seed)
    faults, at = [], 5.0
    while at < seconds - 10:
        draw = rng.random()
        if draw < 0.5:
            fault = Fault(round(at, 1), "kill", rng.choice(KILLABLE), round(rng.uniform(0.5, 3), 1))
        elif draw < 0.8:
            fault = Fault(round(at, 1), "pause", rng.choice(PAUSABLE), round(rng.uniform(2, 6), 1))
        else:  # past the lease / the lost threshold
            target, hold = rng.choice(LONG_PAUSABLE), rng.uniform(*LONG_PAUSE_S)
            fault = Fault(round(at, 1), "pause", target, round(hold, 1))
        faults.append(fault)
        at += rng.uniform(8, 20)
    return faults


def _pid(system: System, target: str) -> int | None:
    if target == "nats":
        return system.nats.pid
    if target == "mongo":
        return system.mongo.pid
    return system.procs[target].pid


def apply(system: System, fault: Fault) -> None:
    if fault.kind == "pause":
        pid = _pid(system, fault.target)
        if pid is None:
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(fault.hold_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        return
    server = {"nats": system.nats, "mongo": system.mongo}.get(fault.target)
    if server is not None:
        server.kill()
        time.sleep(fault.hold_s)
        server.start()
    else:
        system.kill(fault.target)
        time.sleep(fault.hold_s)
        system.restart(fault.target)


class Load:
    """Short jobs submitted one after another; the ids the scheduler acknowledged."""

    def __init__(self, system: System, seed: int) -> None:
        self.system, self.rng = system, random.Random(seed + 1)
        self.acked: list[str] = []
        self.refused = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            args = ["--", "sleep", str(self.rng.choice((0, 1, 2)))]
            try:
                self.acked.append(self.system.submit(*args, name=f"chaos{n}"))
            except Exception:
                self.refused += 1  # not acknowledged: no promise was made
                time.sleep(0.5)


def _job_states(system: System, ids: list[str]) -> dict[str, str]:
    stored = stored_job_states(system)
    return {i: stored.get(i, "missing") for i in ids}


def measure(system: System, acked: list[str], settle_s: float) -> dict[str, Any]:
    """Wait (up to `settle_s`) for every acked job to end and the outboxes to drain; then
    the figures."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        states = _job_states(system, acked)
        if all(s in ENDED for s in states.values()) and not outbox(system):
            break
        time.sleep(2)
    time.sleep(5)  # billing's consumers settle the last runs
    states = _job_states(system, acked)
    events = stream_events(system)
    started = Counter(
        str(b.get("job_id")) for _, t, b in events if t == "gpufleet.worker.started.v1"
    )
    charges = charges_per_job(system)
    drift = ledger_drift(system)
    shown = system.json("billing", "balance")
    if int(shown["entries"]) <= 1000:  # the most one `billing entries` lists
        entries = system.json("billing", "entries", "--limit", "1000")["entries"]
        listed = sum(int(e["amount_micro"]) for e in entries)
        if listed != int(shown["balance_micro"]):
            drift.append(f"balance {shown['balance_micro']} != its entries' sum {listed}")
    derived = state_drift(stored_job_states(system), job_states_from_events(events))
    derived += state_drift(stored_node_states(system), node_states_from_events(events))
    return {
        "acked jobs lost": sum(s == "missing" for s in states.values()),
        "GPUs given twice": len(gpus_given_twice(system, acked)),
        "double charges": sum(max(0, n - started[j]) for j, n in charges.items()),
        "ledger drift": len(drift),
        "jobs stuck": sum(s not in ENDED and s != "missing" for s in states.values()),
        "state drift": len(derived),
        "_details": {
            "jobs acked": len(acked),
            "by state": dict(Counter(states.values())),
            "drift": drift[:10],
            "state drift": derived[:10],
        },
    }


def run(system: System, seconds: float, seed: int, settle_s: float = 300) -> dict[str, Any]:
    plan = schedule(seed, seconds)
    print(f"chaos: seed {seed}, {seconds:g} s, {len(plan)} faults", flush=True)
    for f in plan:
        print(f"  t+{f.at_s:6.1f}s  {f.kind:5} {f.target:12} {f.hold_s:.1f}s", flush=True)
    load = Load(system, seed)
    start = time.monotonic()
    load.thread.start()
    try:
        for fault in plan:
            time.sleep(max(0.0, start + fault.at_s - time.monotonic()))
            print(f"  applying {fault.kind} {fault.target}", flush=True)
            apply(system, fault)
        time.sleep(max(0.0, start + seconds - time.monotonic()))
    finally:
        load.stop.set()
        load.thread.join(timeout=180)
    figures = measure(system, list(load.acked), settle_s)
    figures["_details"]["refused submissions"] = load.refused
    figures["seed"], figures["seconds"] = seed, seconds
    figures["schedule"] = [asdict(f) for f in plan]
    return figures


def failures(figures: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in figures.items() if not k.startswith("_") and isinstance(v, int)
            and k not in ("seed", "seconds") and v}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="just chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    root = Path(tempfile.mkdtemp(prefix="gpufleet-chaos-"))
    system = System(root)
    system.start()
    try:
        figures = run(system, args.seconds, seed)
    finally:
        system.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    bad = failures(figures)
    print(f"chaos: seed {seed}: " + ("every invariant holds" if not bad else f"FAILED {bad}"))
    print(f"chaos: logs and stores in {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
