"""logcap.py: a worker's output within bounds on the node's disk (real files, no NATS);
what reaches the log stream is tested in test_workers.py."""

from __future__ import annotations

from pathlib import Path

from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import LOG_FILE, PodmanConfig
from gpufleet_node_agent.worker import logcap
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker


def test_punched_blocks_read_as_zeros_and_the_size_stays(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"a" * 1_000_000)
    assert logcap.punch(f, 5000, 900_000)  # whole blocks inside: [8192, 897024)
    data = f.read_bytes()
    assert len(data) == 1_000_000
    assert data[:8192] == b"a" * 8192 and data[8192:897024] == bytes(897024 - 8192)
    assert data[897024:] == b"a" * (1_000_000 - 897024)
    assert f.stat().st_blocks * 512 < 200_000


def k8s(text: str) -> bytes:
    return b"".join(f"2026-11-23T13:00:00Z stdout F {t}\n".encode() for t in text.splitlines())


def test_podman_log_is_freed_once_converted_and_a_backlog_too_large_is_skipped(
    tmp_path: Path,
) -> None:
    runtime = PodmanRuntime(PodmanConfig(image="localhost/none"), "m1")
    w = Worker(WorkerSpec(placement_id="pl-1", job_id="job-1", worker=0), tmp_path)
    conmon = tmp_path / LOG_FILE
    lines = "".join(f"line {i}\n" for i in range(20000))
    conmon.write_bytes(k8s(lines))
    runtime.convert_log(w)
    assert w.file("log").read_text() == lines
    assert conmon.stat().st_blocks * 512 < 64 * 1024  # converted: freed
    # a job printing faster than the agent converts: the backlog beyond BACKLOG_MAX goes
    with conmon.open("ab") as f:
        f.truncate(conmon.stat().st_size + logcap.BACKLOG_MAX + 10)  # (a sparse stand-in)
        f.write(k8s("lost in the flood"))
    runtime.convert_log(w)  # skipped up to its last whole record
    with conmon.open("ab") as f:
        f.write(k8s("after the flood"))
    runtime.convert_log(w)
    out = w.file("log").read_text()
    assert out.startswith(lines) and out.endswith("after the flood\n")
    skipped = logcap.BACKLOG_MAX + 10 + len(k8s("lost in the flood"))
    assert f"[gpufleet: {skipped} bytes of output skipped]" in out
    assert conmon.stat().st_blocks * 512 < 64 * 1024
