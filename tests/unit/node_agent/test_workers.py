"""Node agent: WorkerManager (start, stop, reports, log shipping, recovery), no NATS."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import StartWorker, WorkerFinished, WorkerStarted, WorkerState
from gpufleet_node_agent.worker import logcap
from gpufleet_node_agent.worker.manager import (
    LOST_AT_RESTART,
    LOST_AT_RUNTIME,
    STOPPED_BEFORE_START,
    WorkerManager,
    dir_name,
)

PY = sys.executable


class FakeBroker:
    """Records publishes; drops a repeated Nats-Msg-Id the way JetStream's dedup does."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []
        self.ids: set[str] = set()
        self.fail = False
        self.fail_logs = False
        self.attempts = 0

    async def publish(
        self,
        message: bytes,
        subject: str,
        headers: dict[str, str] | None = None,
        stream: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the broker's signature
    ) -> None:
        self.attempts += 1
        if self.fail or (self.fail_logs and ".log." in subject):
            raise ConnectionError("nats is down")
        assert headers is not None
        if headers["Nats-Msg-Id"] in self.ids:
            return
        self.ids.add(headers["Nats-Msg-Id"])
        self.sent.append((subject, message, headers))

    def events(self, cls: type[Any]) -> list[Any]:
        return [cls.from_bytes(m) for s, m, h in self.sent if h["ce-type"] == cls.TYPE]

    def log_bytes(self, job_id: str, worker: int) -> bytes:
        return b"".join(m for s, m, _ in self.sent if s == f"gpufleet.v1.log.m1.{job_id}.{worker}")


def cmd(placement: str = "pl-1", command: list[str] | None = None, **kw: Any) -> StartWorker:
    fields: dict[str, Any] = {
        "minion_id": "m1",
        "job_id": "job-1",
        "job_name": "demo",
        "worker": 0,
        "command": command or [PY, "-c", "print('hello from worker')"],
        "gpu_indices": [0],
        "placement_id": placement,
        **kw,
    }
    return StartWorker(**fields)


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


@pytest.fixture
def managers(tmp_path: Path, broker: FakeBroker) -> Iterator[Callable[..., WorkerManager]]:
    """Managers on one state dir; every worker left running is stopped at the end."""
    made: list[WorkerManager] = []

    def make(**kw: Any) -> WorkerManager:
        m = WorkerManager(tmp_path, "m1", broker, gpu_indices=[0, 1], **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        for w in m.active.values():
            m.stop(w.job_id, w.worker, w.placement_id, "test over")
        for w in m.active.values():
            if w.proc is not None:
                w.proc.wait(timeout=15)


async def until(m: WorkerManager, cond: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while True:
        await m.poll_once()
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


async def finished(m: WorkerManager, broker: FakeBroker, placement: str) -> WorkerFinished:
    def done() -> bool:
        return any(e.placement_id == placement for e in broker.events(WorkerFinished))

    await until(m, done)
    (evt,) = [e for e in broker.events(WorkerFinished) if e.placement_id == placement]
    return evt  # type: ignore[no-any-return]


async def test_runs_and_reports(managers: Callable[..., WorkerManager], broker: FakeBroker) -> None:
    m = managers()
    assert m.start(cmd()) is True
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.exit_code, evt.reason) == (WorkerState.finished, 0, None)
    assert evt.log_tail == "hello from worker\n"
    assert evt.minion_id == "m1" and evt.started_at is not None
    assert evt.ended_at >= evt.started_at
    (started,) = broker.events(WorkerStarted)
    assert started.placement_id == "pl-1" and isinstance(started.pid, int)
    assert broker.log_bytes("job-1", 0) == b"hello from worker\n"
    ids = [h["Nats-Msg-Id"] for _, _, h in broker.sent]
    assert ids == ["started:pl-1", "pl-1:0", "finished:pl-1"]  # log shipped before finished
    d = m.worker_dir("pl-1")
    assert (d / "reported_started").exists() and (d / "reported_finished").exists()
    assert m.active == {} and m.running() == []


async def test_start_is_idempotent(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    c = cmd(command=[PY, "-c", "print('once')"])
    assert m.start(c) is True
    assert m.start(c) is False  # a redelivered command
    await finished(m, broker, "pl-1")
    assert m.start(c) is False  # even after it finished
    assert managers().start(c) is False  # and after a restart
    assert (m.worker_dir("pl-1") / "log").read_text() == "once\n"
    assert len(broker.events(WorkerStarted)) == 1


async def test_failed_with_exit_code(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    m.start(cmd(command=[PY, "-c", "import sys; print('oops'); sys.exit(3)"]))
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.exit_code, evt.reason) == (WorkerState.failed, 3, "exited with code 3")
    assert evt.log_tail == "oops\n"


async def test_unknown_gpu_is_refused(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    assert m.start(cmd(gpu_indices=[1, 7])) is False
    evt = await finished(m, broker, "pl-1")
    assert evt.state == WorkerState.failed
    assert "GPU index [7] is not on this node" in (evt.reason or "")
    assert broker.events(WorkerStarted) == []


async def test_stop_running_worker(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    m.start(cmd(command=[PY, "-c", "import time; print('up', flush=True); time.sleep(60)"]))
    log = m.worker_dir("pl-1") / "log"
    await until(m, lambda: len(broker.events(WorkerStarted)) == 1 and log.read_bytes() != b"")
    assert m.running() == ["job-1/0"]
    m.stop("job-1", 0, "pl-1", "cancelled by user")
    m.stop("job-1", 0, "pl-1", "cancelled by user")  # redelivered: harmless
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.reason) == (WorkerState.stopped, "cancelled by user")
    assert evt.log_tail == "up\n"


async def test_stop_all_stops_and_reports_every_worker_while_the_loop_runs(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    sleeper = [PY, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    m.start(cmd(placement="pl-1", command=sleeper))
    m.start(cmd(placement="pl-2", job_id="job-2", command=sleeper, gpu_indices=[1]))
    loop = asyncio.create_task(m.run(interval=0.05, check_s=0.2))
    try:
        await until(m, lambda: len(broker.events(WorkerStarted)) == 2)
        assert await m.stop_all("the node goes", timeout_s=20) == []
    finally:
        loop.cancel()
    assert m.active == {} and m.running() == []
    ended = broker.events(WorkerFinished)
    assert sorted((e.job_id, e.state, e.reason) for e in ended) == [
        ("job-1", WorkerState.stopped, "the node goes"),
        ("job-2", WorkerState.stopped, "the node goes"),
    ]


async def test_stop_all_says_which_workers_did_not_end_in_time(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    m.start(cmd(command=[PY, "-c", "import time; time.sleep(60)"]))
    # no watch loop: nothing records or reports the end
    assert await m.stop_all("the node goes", timeout_s=0.3) == ["job-1/0"]


async def test_stop_before_start(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    m.stop("job-9", 3, "pl-9", "cancelled by user")
    evt = await finished(m, broker, "pl-9")
    assert (evt.job_id, evt.worker, evt.state, evt.reason) == (
        "job-9",
        3,
        WorkerState.stopped,
        STOPPED_BEFORE_START,
    )
    # The StartWorker that the StopWorker overtook must not start it now.
    assert m.start(cmd(placement="pl-9", job_id="job-9", worker=3)) is False
    assert broker.events(WorkerStarted) == []


async def test_reports_are_retried_until_acknowledged(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    broker.fail = True
    m.start(cmd())
    d = m.worker_dir("pl-1")
    await until(m, lambda: (d / "exit.json").exists())
    await m.poll_once()
    assert broker.sent == [] and not (d / "reported_started").exists()
    assert m.active  # still to be reported
    broker.fail = False
    evt = await finished(m, broker, "pl-1")
    assert evt.state == WorkerState.finished
    assert len(broker.events(WorkerStarted)) == 1


async def test_log_chunks_and_resume_after_crash(
    managers: Callable[..., WorkerManager], broker: FakeBroker, tmp_path: Path
) -> None:
    m = managers(log_chunk_bytes=1000)
    text = "".join(f"line {i:04d}\n" for i in range(500))  # 5000 bytes
    script = tmp_path / "spew.py"
    script.write_text(f"import sys; sys.stdout.write({text!r})")
    broker.fail_logs = True  # the first chunk reaches JetStream, but its ack is lost
    m.start(cmd(command=[PY, str(script)]))
    d = m.worker_dir("pl-1")
    await until(m, lambda: (d / "exit.json").exists())
    await m.poll_once()
    assert (d / "log.pending").read_text() == "5000"  # a round's chunks go as one batch
    assert not (d / "log.offset").exists()
    broker.ids.add("pl-1:0")
    broker.fail_logs = False
    await finished(m, broker, "pl-1")
    ids = [
        h["Nats-Msg-Id"]
        for _, _, h in broker.sent
        if ":" in h["Nats-Msg-Id"] and not h["Nats-Msg-Id"].startswith(("started", "finished"))
    ]
    assert ids == ["pl-1:1000", "pl-1:2000", "pl-1:3000", "pl-1:4000"]
    assert text.encode()[1000:] == broker.log_bytes("job-1", 0)
    assert all(len(m_) <= 1000 for s, m_, _ in broker.sent if ".log." in s)
    assert (d / "log.offset").read_text() == "5000"


# --- recovery ---------------------------------------------------------------------------


def seed(m: WorkerManager, placement: str, **files: Any) -> Path:
    d = m.worker_dir(placement)
    d.mkdir(parents=True)
    spec = {"placement_id": placement, "job_id": "job-r", "worker": 1, "command": ["true"]}
    (d / "spec.json").write_text(json.dumps(spec))
    for name, data in files.items():
        content = data if isinstance(data, str) else json.dumps(data)
        (d / name.replace("_json", ".json").replace("_pid", ".pid")).write_text(content)
    return d


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


async def test_recover_classifies_workers(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    first = managers()
    # alive: a real supervisor, started by a previous agent
    first.start(cmd(placement="alive", command=[PY, "-c", "import time; time.sleep(1.5)"]))
    await until(first, lambda: (first.worker_dir("alive") / "started.json").exists())
    seed(
        first,
        "done",
        started_json={"pid": 1, "started_at": "2025-01-01T00:00:00+00:00"},
        exit_json={"exit_code": 0, "ended_at": "2025-01-01T01:00:00+00:00"},
        supervisor_pid=str(dead_pid()),
    )
    seed(
        first,
        "lost",
        supervisor_pid=str(dead_pid()),
        started_json={"pid": dead_pid(), "started_at": "2025-01-01T00:00:00+00:00"},
    )
    seed(first, "reused", supervisor_pid=str(os.getpid()))  # pid reused by another program
    seed(first, "accepted")  # not launched yet: its steps, then its launch, go on
    old = seed(first, "reported", exit_json={"exit_code": 0, "ended_at": "x"}, reported_finished="")
    assert old.exists()

    m = managers()  # the restarted agent
    found = m.recover()
    assert found.finished == ["done"]
    assert found.reattached == ["accepted", "alive"]
    assert sorted(found.lost) == ["lost", "reused"]
    assert set(m.active) == {"accepted", "alive", "done", "lost", "reused"}
    assert m.running() == ["job-1/0", "job-r/1"]  # launched as the agent picked it up
    assert m.recover().finished == []  # idempotent: nothing is picked up twice

    for p in ("done", "lost", "accepted", "reused", "alive"):
        await finished(m, broker, p)
    by_id = {e.placement_id: e for e in broker.events(WorkerFinished)}
    assert (by_id["done"].state, by_id["done"].exit_code) == (WorkerState.finished, 0)
    assert by_id["done"].started_at is not None
    for p in ("lost", "reused"):
        assert (by_id[p].state, by_id[p].reason) == (WorkerState.failed, LOST_AT_RESTART)
    assert by_id["alive"].state == WorkerState.finished  # re-attached and watched to its end
    assert by_id["accepted"].state == WorkerState.finished  # `true`, launched after all
    assert "reported" not in by_id
    assert len(broker.events(WorkerFinished)) == 5


async def test_supervisor_killed_while_running_is_lost(
    managers: Callable[..., WorkerManager], broker: FakeBroker
) -> None:
    m = managers()
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    m.start(cmd(command=[PY, "-c", code]))
    log = m.worker_dir("pl-1") / "log"
    await until(m, lambda: log.exists() and log.read_text().strip() != "")
    child = int(log.read_text())
    sup = m.active["pl-1"].proc
    assert sup is not None
    sup.kill()  # kill -9 of the supervisor
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.reason) == (WorkerState.failed, LOST_AT_RUNTIME)
    # and its orphaned command does not keep the GPUs
    deadline = time.monotonic() + 10
    while gone(child) is False:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


def gone(pid: int) -> bool:
    """True when `pid` is no process, or only a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def test_dir_name_is_safe() -> None:
    assert dir_name("0f3a-placement_1.2") == "0f3a-placement_1.2"
    for bad in ("../etc", "a/b", ".hidden", "", "x" * 200):
        name = dir_name(bad)
        assert name.startswith("h-") and "/" not in name
    assert dir_name("a/b") != dir_name("a/c")


async def test_the_watch_loop_stops_when_cancelled_as_news_arrives(
    managers: Callable[..., WorkerManager],
) -> None:
    """The agent's stop cancels the loop; news arriving at that moment must not keep it
    running (3.11's asyncio.wait_for could swallow such a cancellation)."""
    m = managers()
    for _ in range(20):
        loop = asyncio.create_task(m.run(interval=60, check_s=60))
        await asyncio.sleep(0.01)  # waiting for news
        m.wake()
        loop.cancel()
        done, _ = await asyncio.wait({loop}, timeout=5)
        assert done == {loop} and loop.cancelled()


async def test_a_worker_that_prints_without_end_costs_the_node_a_bounded_log(
    managers: Callable[..., WorkerManager], broker: FakeBroker, tmp_path: Path
) -> None:
    """logcap.py: 64 MB printed, 256 KiB kept and shipped, then one notice; the node frees
    what comes after (the file's blocks, not its size), keeping the tail for the end."""
    cap = 256 * 1024
    m = managers(log_max_bytes=cap)
    script = tmp_path / "flood.py"
    script.write_text(
        "import sys\nline = b'x' * 1023 + b'\\n'\n"
        "for i in range(65536): sys.stdout.buffer.write(line)\n"
        "sys.stdout.buffer.write(b'the last words\\n')\n"
    )
    m.start(cmd(command=[PY, str(script)]))
    evt = await finished(m, broker, "pl-1")

    assert evt.state == WorkerState.finished and evt.log_tail.endswith("the last words\n")
    shipped = broker.log_bytes("job-1", 0)
    assert shipped.startswith(b"x" * 1023 + b"\n")
    assert len(shipped) < cap + 200 and shipped.endswith(logcap.notice(cap))
    log = m.worker_dir("pl-1") / "log"
    st = log.stat()
    assert st.st_size == 65536 * 1024 + 15  # the job's view: everything it wrote
    assert st.st_blocks * 512 <= cap + logcap.TAIL_BYTES + 1024 * 1024  # the node's cost
    ids = [h["Nats-Msg-Id"] for _, _, h in broker.sent]
    assert ids.count("pl-1:capped") == 1
