"""Node agent: the detached worker supervisor, run as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from gpufleet_node_agent.supervise import worker_env

PY = sys.executable


def make_dir(tmp_path: Path, command: list[str], **spec: Any) -> Path:
    d = tmp_path / "w"
    d.mkdir()
    full = {
        "placement_id": "p1",
        "job_id": "job-1",
        "job_name": "train it",
        "worker": 2,
        "gpu_indices": [1, 0],
        "env": {},
        "command": command,
        **spec,
    }
    (d / "spec.json").write_text(json.dumps(full))
    return d


def supervise(d: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PY, "-m", "gpufleet_node_agent.supervise", str(d)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def run(d: Path) -> dict[str, Any]:
    proc = supervise(d)
    assert proc.wait(timeout=30) == 0
    ended: dict[str, Any] = json.loads((d / "exit.json").read_text())
    return ended


def wait_for(cond: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_runs_command_with_gpus_and_worker_number(tmp_path: Path) -> None:
    code = (
        "import os,sys;print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['WORKER_NUMBER']);"
        "print('to stderr', file=sys.stderr)"
    )
    d = make_dir(tmp_path, [PY, "-c", code])
    ended = run(d)
    assert ended["exit_code"] == 0 and "stopped" not in ended and "signal" not in ended
    log = (d / "log").read_text()
    assert "1,0 2\n" in log and "to stderr\n" in log
    started = json.loads((d / "started.json").read_text())
    assert isinstance(started["pid"], int) and started["started_at"].endswith("+00:00")
    assert ended["ended_at"] >= started["started_at"]
    assert int((d / "supervisor.pid").read_text()) > 0
    assert (d / "output").is_dir()
    assert not list(d.glob(".*.tmp"))  # atomic writes left nothing behind


def test_exit_code_propagates(tmp_path: Path) -> None:
    d = make_dir(tmp_path, [PY, "-c", "import sys; print('bye'); sys.exit(3)"])
    assert run(d)["exit_code"] == 3
    assert (d / "log").read_text() == "bye\n"


def test_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_NATS_URL", "nats://user:secret@host:4222")
    monkeypatch.setenv("SOME_HOST_VAR", "kept")
    code = "import json,os; print(json.dumps(dict(os.environ)))"
    d = make_dir(
        tmp_path,
        [PY, "-c", code],
        gpu_indices=[3],
        env={
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "JOB_ID": "forged",
            "MY_VAR": "x",
            "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
        },
    )
    assert run(d)["exit_code"] == 0
    env = json.loads((d / "log").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # the job cannot widen its GPUs
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["JOB_ID"] == "job-1" and env["JOB_NAME"] == "train it"
    assert env["WORKER_NUMBER"] == "2"
    assert env["ML_OUTPUT_PATH"] == str(d / "output")
    assert env["MY_VAR"] == "x" and env["SOME_HOST_VAR"] == "kept"
    assert env["PATH"] == os.environ["PATH"]
    assert not any(k.startswith("GPUFLEET_") for k in env)  # the agent's settings stay private


def test_no_gpus_is_an_empty_cuda_visible_devices(tmp_path: Path) -> None:
    spec = {"job_id": "j", "worker": 0, "gpu_indices": [], "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}
    env = worker_env(spec, tmp_path, {"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["JOB_NAME"] == ""
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # a CPU-only worker (R-JOB-2)


def test_missing_program(tmp_path: Path) -> None:
    d = make_dir(tmp_path, ["/nonexistent/train"])
    ended = run(d)
    assert ended["exit_code"] == 127 and "cannot start" in ended["error"]
    assert "cannot start" in (d / "log").read_text()
    assert not (d / "started.json").exists()


def test_sigterm_stops_the_command(tmp_path: Path) -> None:
    d = make_dir(tmp_path, [PY, "-c", "import time; print('ready', flush=True); time.sleep(60)"])
    proc = supervise(d)
    wait_for(lambda: (d / "log").exists() and "ready" in (d / "log").read_text())
    child = json.loads((d / "started.json").read_text())["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    ended = json.loads((d / "exit.json").read_text())
    assert ended["stopped"] is True
    assert (ended["exit_code"], ended["signal"]) == (128 + signal.SIGTERM, signal.SIGTERM)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    code = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('ready', flush=True); time.sleep(60)"
    )
    d = make_dir(tmp_path, [PY, "-c", code], stop_grace_s=0.5)
    proc = supervise(d)
    wait_for(lambda: (d / "log").exists() and "ready" in (d / "log").read_text())
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert time.monotonic() - t0 < 5
    ended = json.loads((d / "exit.json").read_text())
    assert ended["stopped"] is True and ended["signal"] == signal.SIGKILL


def test_stop_requested_before_start(tmp_path: Path) -> None:
    d = make_dir(tmp_path, [PY, "-c", "print('must not run')"])
    (d / "stop_requested").write_text("cancelled by user")
    ended = run(d)
    assert ended["stopped"] is True and ended["exit_code"] is None
    assert not (d / "log").exists() and not (d / "started.json").exists()


def test_leftover_processes_of_the_job_are_killed(tmp_path: Path) -> None:
    # The command starts a background sleeper and exits: the sleeper must not outlive it.
    code = "import subprocess,sys; p=subprocess.Popen(['sleep','60']);print(p.pid, flush=True)"
    d = make_dir(tmp_path, [PY, "-c", code])
    assert run(d)["exit_code"] == 0
    sleeper = int((d / "log").read_text().split()[0])
    wait_for(
        lambda: (
            not Path(f"/proc/{sleeper}").exists()
            or Path(f"/proc/{sleeper}/stat").read_text().split(")")[-1].split()[0] == "Z"
        )
    )


def test_the_supervisor_starts_without_pydantic() -> None:
    """One supervisor starts per bare-process worker: importing pydantic (through
    gpufleet_auth and the contracts) cost it ~0.57 s of CPU a job (benchmarks/runtime)."""
    import subprocess
    import sys

    probe = "import sys, gpufleet_node_agent.supervise; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
