"""A container's command that was never executed, read back from catatonit's line on the
worker's log (execfail.py), told apart from a command that ran and exited 1."""

from __future__ import annotations

from pathlib import Path

from gpufleet_node_agent.runtimes.execfail import in_container, not_executed
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

CATATONIT = "ERROR (catatonit:2): failed to exec pid1: {}\n"


def test_catatonits_failed_exec_is_command_not_found(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text(CATATONIT.format("No such file or directory"))
    assert in_container(log, ["python", "-c", "print(1)"]) == {
        "exit_code": 127,
        "reason": "command not found: python",
    }


def test_a_command_found_but_not_executable_is_126(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text(CATATONIT.format("Permission denied"))
    assert in_container(log, ["/opt/ml/models/run.sh"]) == {
        "exit_code": 126,
        "reason": "command cannot be executed: /opt/ml/models/run.sh (Permission denied)",
    }


def test_a_command_that_ran_and_exited_1_is_left_as_it_is(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("Traceback (most recent call last):\nValueError: no data\n")
    assert in_container(log, ["python", "train.py"]) is None
    assert in_container(tmp_path / "no-log", ["python"]) is None


def test_only_the_logs_end_is_read(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text(CATATONIT.format("No such file or directory") + "x" * 10_000 + "\n")
    assert in_container(log, ["python"]) is None  # long ago, not how it ended


def test_not_executed_says_it_on_the_log(tmp_path: Path) -> None:
    spec = WorkerSpec(placement_id="p1", job_id="job-1", worker=0, command=("pythn", "x.py"))
    w = Worker(spec.model_copy(update={"runtime": "podman"}), tmp_path)
    w.file("log").write_text(CATATONIT.format("No such file or directory"))
    assert not_executed(w) == {"exit_code": 127, "reason": "command not found: pythn"}
    assert (
        w.file("log").read_text().endswith("gpufleet: command not found: pythn (exit status 127)\n")
    )
