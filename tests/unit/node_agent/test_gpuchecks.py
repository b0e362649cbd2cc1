"""The node's answers to GPU checks (gpuchecks.py): the check runs out of process under
the command's timeout, and whatever becomes of it is answered on the node's own subject
with the command's nonce."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpufleet_contracts.verification import GpuCheckReported, VerifyGpus
from gpufleet_node_agent.host.gpuchecks import GpuChecks, gpus_in_use
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

MINION = "box-1"


class Sent:
    """A broker that keeps what is published."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes, dict[str, str]]] = []

    async def publish(
        self,
        message: bytes,
        subject: str,
        *,
        headers: dict[str, str] | None = None,
        stream: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the broker's signature
    ) -> object:
        self.messages.append((subject, message, headers or {}))
        return None


def verify(timeout_s: float = 30.0, minion: str = MINION) -> VerifyGpus:
    return VerifyGpus(
        minion_id=minion,
        check_id="c" * 32,
        nonce="n" * 43,
        timeout_s=timeout_s,
        deadline=datetime.now(UTC) + timedelta(seconds=300),
    )


def checks(
    sent: Sent, command: list[str] | None = None, busy: set[int] | None = None, sim: bool = False
) -> GpuChecks:
    kw: dict[str, Any] = {} if command is None else {"command": command}
    return GpuChecks(MINION, sent, simulated=lambda: sim, in_use=lambda: busy or set(), **kw)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def answered(sent: Sent, c: GpuChecks, cmd: VerifyGpus) -> GpuCheckReported:
    await c.on_verify_gpus(cmd)
    for _ in range(600):
        if sent.messages:
            break
        await asyncio.sleep(0.05)
    (subject, payload, headers) = sent.messages[-1]
    assert subject == f"gpufleet.v1.evt.node.gpu_checked.{MINION}"
    assert headers["ce-type"] == GpuCheckReported.TYPE
    report = GpuCheckReported.from_bytes(payload)
    assert (report.minion_id, report.check_id, report.nonce) == (MINION, cmd.check_id, cmd.nonce)
    return report


async def test_a_simulated_node_answers_that_its_gpus_are_simulated() -> None:
    """At once: no process is started (there is none to start here)."""
    sent = Sent()
    report = await answered(sent, checks(sent, ["/nonexistent/gpucheck"], sim=True), verify())
    assert report.result.simulated and report.result.error is None
    assert report.result.cpu_count  # the host, as the check sees it


async def test_the_check_gets_the_nonce_and_the_gpus_in_use() -> None:
    sent = Sent()
    echo = script(
        "import json, os, sys; print('noise'); "
        "print(json.dumps({'error': ' '.join(sys.argv[1:]), "
        "'driver_version': os.environ.get('CUDA_VISIBLE_DEVICES', 'all') + ' ' + "
        "os.environ.get('GPUFLEET_JOIN_TOKEN', 'none')}))"
    )
    # the agent's own: not the check's
    os.environ.update(CUDA_VISIBLE_DEVICES="0", GPUFLEET_JOIN_TOKEN="secret")
    try:
        report = await answered(sent, checks(sent, echo, busy={2, 0}), verify())
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUFLEET_JOIN_TOKEN"]
    assert report.result.error == f"--nonce {'n' * 43} --skip 0,2"
    assert report.result.driver_version == "all none"


async def test_a_check_past_its_timeout_is_killed_and_answered(tmp_path: Path) -> None:
    sent = Sent()
    pidfile = tmp_path / "pid"
    hang = script(
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    report = await answered(sent, checks(sent, hang), verify(timeout_s=1.0))
    assert report.result.error == "the GPU check did not finish within 1 s"
    assert not alive(int(pidfile.read_text()))  # killed and reaped, not left running


async def test_a_check_that_fails_or_prints_nonsense_is_answered_with_why() -> None:
    sent = Sent()
    crash = script("import sys; print('Traceback: boom', file=sys.stderr); sys.exit(3)")
    report = await answered(sent, checks(sent, crash), verify())
    assert report.result.error == "the GPU check exited with status 3: Traceback: boom"
    sent = Sent()
    nonsense = script("print(json := '{\"gpus\": 7}')")
    report = await answered(sent, checks(sent, nonsense), verify())
    assert report.result.error is not None
    assert report.result.error.startswith("the GPU check printed no answer it may give")
    sent = Sent()
    missing = ["/nonexistent/gpucheck"]
    report = await answered(sent, checks(sent, missing), verify())
    assert str(report.result.error).startswith("the GPU check could not start")


async def test_a_command_for_another_node_is_not_answered() -> None:
    sent = Sent()
    await checks(sent, sim=True).on_verify_gpus(verify(minion="other"))
    await asyncio.sleep(0.5)
    assert sent.messages == []


def test_the_gpus_in_use_are_those_of_the_nodes_placements(tmp_path: Path) -> None:
    def worker(name: str, **spec: Any) -> Worker:
        return Worker(WorkerSpec(placement_id=name, job_id="j", worker=0, **spec), tmp_path)

    workers = SimpleNamespace(
        active={
            "p1": worker("p1", gpu_indices=(0, 3)),
            "p2": worker("p2", gpu_indices=(3,), gpu_fraction="0.5"),
            "p3": worker("p3", gpu_indices=(), cpu_count=8),
            "p4": worker("p4"),  # a tombstone: stopped before it started
        }
    )
    assert gpus_in_use(workers) == {0, 3}  # type: ignore[arg-type]
