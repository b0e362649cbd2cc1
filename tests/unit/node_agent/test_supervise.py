"""Node agent: the bare-process worker's shell supervisor, run as a real process through
ProcessRuntime (launch, stop, and the end it records)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from gpufleet_node_agent.runtimes.process import ProcessRuntime
from gpufleet_node_agent.runtimes.supervise import is_supervisor, supervisor_argv, worker_env
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

PY = sys.executable


def make_worker(tmp_path: Path, command: list[str], **spec: Any) -> Worker:
    """A worker whose steps are set up (its output directory made: the outputs step)."""
    d = tmp_path / "w"
    d.mkdir()
    full = {
        "placement_id": "p1",
        "job_id": "job-1",
        "job_name": "train it",
        "worker": 2,
        "gpu_indices": [1, 0],
        "command": command,
        "runtime": "process",
        **spec,
    }
    (d / "output").mkdir()
    return Worker(WorkerSpec.model_validate(full), d)


def launch(rt: ProcessRuntime, w: Worker) -> None:
    """The runtime's launch, as the manager's pipeline awaits it: a bare worker's starts
    without waiting on anything."""
    coro = rt.launch(w)
    with pytest.raises(StopIteration):
        coro.send(None)


def ended(rt: ProcessRuntime, w: Worker) -> dict[str, Any]:
    """Wait for the supervisor to end; its exit.json (as the agent records it)."""
    if w.proc is not None:
        w.proc.wait(timeout=30)
    assert not rt.alive(w)  # which also records the end
    data: dict[str, Any] = json.loads(w.file("exit.json").read_text())
    return data


def run(tmp_path: Path, command: list[str], **spec: Any) -> tuple[Worker, dict[str, Any]]:
    rt = ProcessRuntime()
    w = make_worker(tmp_path, command, **spec)
    launch(rt, w)
    return w, ended(rt, w)


def wait_for(cond: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


async def eventually(cond: Any, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def test_runs_command_with_gpus_and_worker_number(tmp_path: Path) -> None:
    code = (
        "import os,sys;print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['WORKER_NUMBER']);"
        "print('to stderr', file=sys.stderr)"
    )
    w, end = run(tmp_path, [PY, "-c", code])
    assert end["exit_code"] == 0 and "stopped" not in end and "signal" not in end
    log = w.file("log").read_text()
    assert "1,0 2\n" in log and "to stderr\n" in log
    started = json.loads(w.file("started.json").read_text())
    assert started["pid"] == int(w.file("supervisor.pid").read_text())  # the group's leader
    assert started["started_at"].endswith("+00:00")
    assert end["ended_at"] >= started["started_at"]
    assert w.file("output").is_dir()
    assert not w.file("exit").exists()  # the shell's record, turned into exit.json
    assert not list(w.dir.glob(".*.tmp"))  # atomic writes left nothing behind


def test_the_supervisor_is_a_shell_and_is_recognised(tmp_path: Path) -> None:
    argv = supervisor_argv(tmp_path, ["true"])
    assert argv[0] == "/bin/sh"  # no Python process per worker (issue 15)
    assert is_supervisor(argv, tmp_path)
    assert not is_supervisor(argv, tmp_path / "other")
    old = [PY, "-m", "gpufleet_node_agent.supervise", str(tmp_path)]  # an older agent's
    assert is_supervisor(old, tmp_path)
    assert not is_supervisor([PY, "-c", str(tmp_path)], tmp_path)


def test_exit_code_propagates(tmp_path: Path) -> None:
    w, end = run(tmp_path, [PY, "-c", "import sys; print('bye'); sys.exit(3)"])
    assert end["exit_code"] == 3
    assert w.file("log").read_text() == "bye\n"


def test_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_NATS_URL", "nats://user:secret@host:4222")
    monkeypatch.setenv("SOME_HOST_VAR", "kept")
    code = "import json,os; print(json.dumps(dict(os.environ)))"
    w = make_worker(tmp_path, [PY, "-c", code], gpu_indices=[3])
    secrets = {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "JOB_ID": "forged",
        "MY_VAR": "x",
        "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
    }
    w.file("env.json").write_text(json.dumps(secrets))
    rt = ProcessRuntime()
    launch(rt, w)
    assert not w.file("env.json").exists()  # the values live on only in the worker's env
    assert ended(rt, w)["exit_code"] == 0
    env = json.loads(w.file("log").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # the job cannot widen its GPUs
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["JOB_ID"] == "job-1" and env["JOB_NAME"] == "train it"
    assert env["WORKER_NUMBER"] == "2"
    assert env["ML_OUTPUT_PATH"] == str(w.file("output"))
    assert env["MY_VAR"] == "x" and env["SOME_HOST_VAR"] == "kept"
    assert env["PATH"] == os.environ["PATH"]
    assert not any(k.startswith("GPUFLEET_") for k in env)  # the agent's settings stay private


def test_no_gpus_is_an_empty_cuda_visible_devices(tmp_path: Path) -> None:
    spec = WorkerSpec(placement_id="p", job_id="j", worker=0, gpu_indices=())
    env = worker_env(spec, tmp_path, {"PATH": "/bin"}, {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["JOB_NAME"] == ""
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # a CPU-only worker (R-JOB-2)


def test_missing_program(tmp_path: Path) -> None:
    w, end = run(tmp_path, ["/nonexistent/train"])
    assert end["exit_code"] == 127 and end["reason"] == "command not found: /nonexistent/train"
    assert "command not found: /nonexistent/train" in w.file("log").read_text()
    assert not w.file("started.json").exists()


def test_a_program_not_on_path_is_not_found_with_127(tmp_path: Path) -> None:
    w, end = run(tmp_path, ["pythn", "-c", "print(1)"])
    assert (end["exit_code"], end["reason"]) == (127, "command not found: pythn")
    assert w.file("log").read_text() == "gpufleet: command not found: pythn (exit status 127)\n"


def test_a_program_that_is_not_executable_is_126(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("echo hi\n")  # no x bit
    _, end = run(tmp_path, [str(script)])
    assert end["exit_code"] == 126
    assert end["reason"] == f"command cannot be executed: {script} (Permission denied)"


def test_a_stop_terminates_the_command(tmp_path: Path) -> None:
    rt = ProcessRuntime()
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    w = make_worker(tmp_path, [PY, "-c", code])
    launch(rt, w)
    wait_for(lambda: w.file("log").exists() and w.file("log").read_text().strip() != "")
    child = int(w.file("log").read_text())
    w.file("stop_requested").write_text("cancelled by user")
    rt.request_stop(w)
    end = ended(rt, w)
    assert end["stopped"] is True
    assert (end["exit_code"], end["signal"]) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert gone(child)
    assert w.file("log").read_text() == f"{child}\n"  # not the shell's "Terminated"


async def test_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    rt = ProcessRuntime()
    code = (
        "import os,signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print(os.getpid(), flush=True); time.sleep(60)"
    )
    w = make_worker(tmp_path, [PY, "-c", code], stop_grace_s=0.5)
    launch(rt, w)
    log = w.file("log")
    await eventually(lambda: log.exists() and log.read_text().strip() != "")
    child = int(log.read_text())
    w.file("stop_requested").write_text("cancelled by user")
    rt.request_stop(w)  # no await: the grace period's SIGKILL comes from the event loop
    proc = w.proc
    assert proc is not None
    await eventually(lambda: proc.poll() is not None)
    # The whole group was killed, its shell too: no `exit`, and the manager records the
    # end as stopped (test_workers.py); nothing of the job is left.
    assert proc.returncode == -signal.SIGKILL
    assert not rt.alive(w) and not w.file("exit.json").exists()
    assert gone(child)


def test_a_job_signalling_its_own_group_does_not_end_its_supervisor(tmp_path: Path) -> None:
    # `kill 0` (SIGTERM to its whole process group, the shell's too): the shell survives it
    # and records how the command ended.
    w, end = run(tmp_path, ["sh", "-c", "echo before; kill 0; echo after"])
    assert end["exit_code"] == 128 + signal.SIGTERM and end["signal_name"] == "SIGTERM"
    assert w.file("log").read_text() == "before\n"


def test_leftover_processes_of_the_job_are_killed(tmp_path: Path) -> None:
    # The command starts a background sleeper and exits: the sleeper must not outlive it.
    code = "import subprocess,sys; p=subprocess.Popen(['sleep','60']);print(p.pid, flush=True)"
    w, end = run(tmp_path, [PY, "-c", code])
    assert end["exit_code"] == 0
    sleeper = int(w.file("log").read_text().split()[0])
    wait_for(lambda: gone(sleeper))
