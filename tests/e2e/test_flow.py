"""The walking skeleton's flow, by hand through the CLI, against every real process."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpufleet_billing.fees import from_micro, usage_micro
from gpufleet_devstack import wait_for
from gpufleet_telemetry.spanfile import read_spans, trace_of_job, tree

from .conftest import System

PRINT_ENV = (
    "import os, time; e = os.environ; "
    "print('hi', e['CUDA_VISIBLE_DEVICES'], e['JOB_ID'], e['WORKER_NUMBER'], e['JOB_NAME'], "
    "os.path.isdir(e['ML_OUTPUT_PATH'])); time.sleep(0.5)"
)


def run_ms(worker: dict[str, Any]) -> int:
    """A worker's run in whole milliseconds, as billing counts it (its times are stored in
    whole milliseconds). Integer arithmetic: `int(delta.total_seconds() * 1000)` is one
    short for 0.7 % of durations (1.001 s * 1000 is 1000.999... in floating point), which
    at a rounding boundary of the micro-credits makes the expected cost one off."""
    ended = datetime.fromisoformat(worker["ended_at"])
    return (ended - datetime.fromisoformat(worker["started_at"])) // timedelta(milliseconds=1)


def test_one_job_from_submission_to_bill(system: System) -> None:
    job_id = system.submit("--", "python", "-c", PRINT_ENV, name="hello")
    job = system.wait_state(job_id, "finished", "failed")
    assert job["state"] == "finished", job
    assert [h["state"] for h in job["history"]] == ["queued", "starting", "running", "finished"]
    (worker,) = job["workers"]
    assert worker["node"] == "local-node-1" and worker["state"] == "finished"
    assert job["rate"] == "0.05"  # RTX 3090: development class usage fee (R-BILL-1)
    gpu = worker["gpu_indices"][0]
    assert f"hi {gpu} {job_id} 0 hello True" in job["log_tail"]

    logs = system.cli("job", "logs", job_id).stdout
    assert f"hi {gpu} {job_id}" in logs

    # Billing charged exactly the locked rate times the measured run time.
    duration_ms = run_ms(worker)
    expected = usage_micro(Decimal("0.05"), 1, duration_ms)
    assert expected > 0
    wait_for(
        lambda: system.job(job_id)["cost"] == str(from_micro(expected)),
        timeout=15,
        message=f"cost of {job_id} never became {from_micro(expected)}",
    )
    breakdown = system.json("billing", "job-cost", job_id)
    assert breakdown["cost_micro"] == expected
    assert sum(-e["amount_micro"] for e in breakdown["entries"]) == expected
    balance = system.json("billing", "balance")
    assert balance["balance_micro"] <= -expected

    listed = system.json("job", "list")["jobs"]
    assert job_id in [j["id"] for j in listed]
    nodes = system.json("node", "list")["nodes"]
    assert nodes[0]["simulated"] is True and len(nodes[0]["gpus"]) == 2


def test_one_job_is_one_trace_from_submission_to_its_ledger_entry(system: System) -> None:
    """Every job of this system is sampled (conftest): its spans, written by each process to
    <root>/traces, share the trace id minted at its submission, across the scheduler, the
    node agent and billing, down to billing taking its end (its ledger entry)."""
    job_id = system.submit("--", "true", name="traced")
    assert system.wait_state(job_id, "finished", "failed")["state"] == "finished"
    found: list[dict[str, Any]] = []

    def billed() -> bool:
        found[:] = trace_of_job(read_spans(system.root / "traces"), job_id)
        return any(
            s["service"] == "billing"
            and str(s["attributes"].get("messaging.message.id", "")).startswith("kept:finished:")
            for s in found
        )

    wait_for(billed, timeout=20, message=f"no billing span of {job_id}'s end")
    assert len({s["trace_id"] for s in found}) == 1, tree(found)
    assert {"scheduler", "node-agent", "billing"} <= {s["service"] for s in found}
    names = {s["name"] for s in found}
    assert {"submit job", "place worker", "run worker"} <= names, tree(found)
    # one tree: every span but the submission's has its parent among them
    ids = {s["span_id"] for s in found}
    assert [s["name"] for s in found if s["parent_id"] not in ids] == ["submit job"], tree(found)


def test_second_job_waits_for_gpus_with_a_reason_and_then_starts(system: System) -> None:
    # Long enough that the small job is surely read while the big one still holds both GPUs
    # (each CLI call is a fresh process: about a second on a loaded 2-core machine).
    big = system.submit("--", "sleep", "20", name="big", gpus=2)
    system.wait_state(big, "running")
    small = system.submit("--", "true", name="small")
    waiting = system.job(small)
    assert waiting["state"] == "queued"
    assert "busy (0 of 2 GPUs free, needs 1)" in waiting["queue_reason"]
    human = system.cli("job", "show", small).stdout
    assert "waiting for GPUs" in human
    done = system.wait_state(small, "finished", timeout=60)
    big_done = system.job(big)
    started = datetime.fromisoformat(done["workers"][0]["started_at"])
    assert started >= datetime.fromisoformat(big_done["workers"][0]["ended_at"])


def test_failed_command_reports_its_exit_code(system: System) -> None:
    job_id = system.submit("--", "python", "-c", "import sys; sys.exit(3)", name="fails")
    job = system.wait_state(job_id, "failed", "finished")
    assert job["state"] == "failed" and job["workers"][0]["exit_code"] == 3
    assert "3" in (job["history"][-1]["reason"] or "")


def test_invalid_job_is_refused_with_every_field_and_nothing_is_stored(system: System) -> None:
    before = len(system.json("job", "list")["jobs"])
    result = system.cli(
        "job",
        "submit",
        "--name",
        "bad",
        "--gpu-type",
        "RTX 9999",
        "--gpu-count",
        "1",
        "--max-price",
        "-1",
        "--disk-size",
        "5",
        "--json",
        "--",
        "true",
        check=False,
    )
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    fields = {f["field"].removeprefix("spec."): f["rule"] for f in error["fields"]}
    assert fields == {"gpu_types": "R-JOB-2", "max_price": "R-JOB-2", "disk_size_gb": "R-JOB-2"}
    assert len(system.json("job", "list")["jobs"]) == before


def test_cancel_stops_a_running_job_and_frees_its_gpu(system: System) -> None:
    job_id = system.submit("--", "sleep", "60", name="long")
    system.wait_state(job_id, "running")
    system.cli("job", "cancel", job_id)
    job = system.wait_state(job_id, "stopped", timeout=20)
    assert job["workers"][0]["state"] == "stopped"
    after = system.submit("--", "true", name="after-cancel", gpus=2)
    assert system.wait_state(after, "finished")["state"] == "finished"


PRINT_NO_GPU = (
    "import os, time; e = os.environ; "
    "print('cpu', repr(e['CUDA_VISIBLE_DEVICES']), e['NVIDIA_VISIBLE_DEVICES']); time.sleep(0.5)"
)


def test_a_cpu_only_job_runs_on_offered_cpus_and_is_billed_per_cpu_hour(system: System) -> None:
    """R-JOB-2: no GPU type, `--gpu-count 0 --cpu-count 8`; the node offers 8 CPUs."""
    cpu = ["job", "submit", "--gpu-count", "0", "--max-price", "0.05"]
    too_big = system.json(*cpu, "--name", "big", "--cpu-count", "12", "--", "true")
    assert too_big["state"] == "queued"
    assert too_big["queue_reason"] == "1 node: offers 8 CPUs to CPU-only jobs, job needs 12"
    system.cli("job", "cancel", too_big["id"])
    job_id = system.json(
        *cpu, "--name", "cpu", "--cpu-count", "8", "--", "python", "-c", PRINT_NO_GPU
    )["id"]
    job = system.wait_state(job_id, "finished", "failed")
    assert job["state"] == "finished", job
    (worker,) = job["workers"]
    assert (worker["cpu_count"], worker["gpu_indices"], job["rate"]) == (8, [], "0.0125")
    assert "cpu '' void" in job["log_tail"]  # no GPU visible
    assert "(8 CPUs)" in system.cli("job", "show", job_id).stdout
    duration_ms = run_ms(worker)
    expected = usage_micro(Decimal("0.0125"), 8, duration_ms)  # per CPU-hour, 8 CPUs
    assert expected > 0
    wait_for(
        lambda: system.job(job_id)["cost"] == str(from_micro(expected)),
        timeout=15,
        message=f"cost of {job_id} never became {from_micro(expected)}",
    )
