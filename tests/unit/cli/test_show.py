"""`gpufleet job show / logs / cancel`: the job merged with its cost and log tail, and what
a cancel did (no NATS)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.client import StreamRecord
from gpufleet_cli.jobs import BILLING_JOB_COST
from gpufleet_cli.main import app
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import CancelJob, GetJob
from typer.testing import CliRunner

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})


def job(state: str = "running", workers: int = 1) -> dict[str, Any]:
    return {
        "id": "j1",
        "name": "train-1",
        "project": "default",
        "owner": "acme",
        "creator": "acme",
        "state": state,
        "queue_reason": "no RTX 3090 free" if state == "queued" else None,
        "rate": "0.25",
        "spec": {"name": "train-1", "workers": workers},
        "history": [
            {"state": "queued", "at": "2025-01-01T10:00:00+00:00", "reason": None},
            {"state": "running", "at": "2025-01-01T10:00:05+00:00", "reason": "placed"},
        ],
        "workers": [
            {
                "index": i,
                "state": "finished",
                "node": "minion-a",
                "gpu_model": "RTX 3090",
                "gpu_indices": [0],
                "rate": "0.25",
                "started_at": "2025-01-01T10:00:05+00:00",
                "ended_at": "2025-01-01T10:01:10+00:00",
                "run_seconds": 65.0,
                "exit_code": 0,
                "reason": None,
                "log_tail": f"tail {i}\n",
            }
            for i in range(workers)
        ],
        "queued_at": "2025-01-01T10:00:00+00:00",
        "notes": [],
    }


COST = {"job_id": "j1", "cost": "0.004514", "cost_micro": 4514, "by_kind": {}, "entries": []}


class Bus:
    """Replies per subject; a subject missing from `replies` has no responder."""

    def __init__(self, replies: dict[str, dict[str, Any]]) -> None:
        self.replies = replies
        self.calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    def send(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        timeout: float,
        retry: bool = False,
    ) -> bytes:
        subject, account = subject.rsplit(".", 1)  # the acting account's subject
        assert account == "acme"
        self.calls.append((subject, json.loads(payload), headers))
        if subject not in self.replies:
            raise client.CliError(f"no service answered on {subject}")
        return json.dumps(self.replies[subject]).encode()


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> list[StreamRecord]:
    records: list[StreamRecord] = []
    seen: list[str] = []

    def read_logs(job_id: str) -> list[StreamRecord]:
        seen.append(job_id)
        return records

    monkeypatch.setattr(client, "read_logs", read_logs)
    return records


def use(monkeypatch: pytest.MonkeyPatch, replies: dict[str, dict[str, Any]]) -> Bus:
    bus = Bus(replies)
    monkeypatch.setattr(client, "send", bus.send)
    return bus


def test_show_json_merges_job_cost_and_log_tail(
    monkeypatch: pytest.MonkeyPatch, logs: list[StreamRecord]
) -> None:
    logs.extend(
        [
            StreamRecord(subjects.log("m1", "j1", 0), b"epoch 1\n", 1),
            StreamRecord(subjects.log("m1", "j1", 0), b"epoch 2\n", 2),
        ]
    )
    bus = use(monkeypatch, {GetJob.SUBJECT: job(), BILLING_JOB_COST: COST})
    result = runner.invoke(app, ["job", "show", "j1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {k: out[k] for k in job()} == job()  # the scheduler's object, unchanged
    assert out["cost"] == "0.004514"
    assert out["cost_micro"] == 4514
    assert out["log_tail"] == "epoch 1\nepoch 2\n"
    assert [(s, p) for s, p, _ in bus.calls] == [
        (GetJob.SUBJECT, {"job_id": "j1"}),
        (BILLING_JOB_COST, {"job_id": "j1"}),
    ]
    assert all("gpufleet-account" not in h for _, _, h in bus.calls)


def test_show_without_billing_has_null_cost_and_worker_tails(
    monkeypatch: pytest.MonkeyPatch, logs: list[StreamRecord]
) -> None:
    use(monkeypatch, {GetJob.SUBJECT: job(workers=2)})
    result = runner.invoke(app, ["job", "show", "j1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["cost"] is None
    assert "billing" in out["cost_note"]
    assert out["log_tail"] == "[w0] tail 0\n[w1] tail 1\n"


def test_show_readable(monkeypatch: pytest.MonkeyPatch, logs: list[StreamRecord]) -> None:
    use(monkeypatch, {GetJob.SUBJECT: job("queued"), BILLING_JOB_COST: COST})
    result = runner.invoke(app, ["job", "show", "j1"])
    assert result.exit_code == 0, result.output
    for text in (
        "j1",
        "train-1",
        "waiting for GPUs: no RTX 3090 free",
        "minion-a",
        "0.25 credits/GPU-hour",
        "1m 05s",
        "0.004514 credits",
        "history",
        "placed",
        "log tail",
        "tail 0",
    ):
        assert text in result.stdout


def test_show_a_cpu_only_job(monkeypatch: pytest.MonkeyPatch, logs: list[StreamRecord]) -> None:
    cpu = job()
    cpu["rate"] = "0.0125"
    cpu["workers"][0].update(gpu_model=None, gpu_indices=[], cpu_count=8, rate="0.0125")
    use(monkeypatch, {GetJob.SUBJECT: cpu, BILLING_JOB_COST: COST})
    result = runner.invoke(app, ["job", "show", "j1"])
    assert result.exit_code == 0, result.output
    assert "minion-a (8 CPUs)" in result.stdout
    assert "0.0125 credits/CPU-hour" in result.stdout


def test_show_unknown_job(monkeypatch: pytest.MonkeyPatch, logs: list[StreamRecord]) -> None:
    refused = {"ok": False, "error": {"code": "not_found", "message": "job j9 not found"}}
    use(monkeypatch, {GetJob.SUBJECT: refused})
    result = runner.invoke(app, ["job", "show", "j9", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == refused
    assert "job j9 not found" in result.stderr


def test_a_wildcard_is_not_a_job_id(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, {})
    result = runner.invoke(app, ["job", "logs", "j1.>", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["code"] == "invalid"


def test_logs_grouped_per_worker(monkeypatch: pytest.MonkeyPatch, logs: list[StreamRecord]) -> None:
    logs.extend(
        [
            StreamRecord(subjects.log("m1", "j1", 1), b"b1\n", 1),
            StreamRecord(subjects.log("m1", "j1", 0), b"a1\na", 2),
            StreamRecord(subjects.log("m1", "j1", 0), b"2\n", 3),
        ]
    )
    use(monkeypatch, {GetJob.SUBJECT: job(workers=2)})
    as_json = runner.invoke(app, ["job", "logs", "j1", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == {"job_id": "j1", "workers": {"0": "a1\na2\n", "1": "b1\n"}}
    text = runner.invoke(app, ["job", "logs", "j1"])
    assert text.stdout == "[w0] a1\n[w0] a2\n[w1] b1\n"


def test_logs_follow_prints_until_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, {GetJob.SUBJECT: job("running", workers=2)})
    seen: dict[str, Any] = {}

    def follow_logs(job_id: str, on_msg: Any, poll: tuple[str, bytes, str], done: Any) -> None:
        seen.update(job_id=job_id, poll=poll)
        assert not done({"state": "running"}) and done({"state": "finished"})
        on_msg(StreamRecord(subjects.log("m1", "j1", 1), b"one\ntw", 1))
        on_msg(StreamRecord(subjects.log("m1", "j1", 1), b"o\n", 2))

    monkeypatch.setattr(client, "follow_logs", follow_logs)
    result = runner.invoke(app, ["job", "logs", "j1", "--follow"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "[w1] one\n[w1] two\n"
    assert seen["job_id"] == "j1"
    assert seen["poll"] == (GetJob.SUBJECT, GetJob(job_id="j1").to_bytes(), GetJob.TYPE)


def test_show_explains_a_waiting_job(
    monkeypatch: pytest.MonkeyPatch, logs: list[StreamRecord]
) -> None:
    waiting = job(state="queued")
    waiting["queue_reason"] = "12 nodes: no RTX 3090; 3 nodes: 2.10 > max price 1.50"
    waiting["queue_detail"] = [
        {"reason": "no RTX 3090", "nodes": 12},
        {"reason": "2.10 > max price 1.50", "nodes": 3},
    ]
    waiting["workers"] = [{"index": 0, "state": "waiting"}]
    waiting["notes"] = [
        {"at": "2025-01-01T10:00:09+00:00", "note": "worker 0 requeued: node a lost"}
    ]
    use(monkeypatch, {GetJob.SUBJECT: waiting, BILLING_JOB_COST: COST})
    result = runner.invoke(app, ["job", "show", "j1"])
    assert result.exit_code == 0, result.output
    for text in (
        "12 nodes: no RTX 3090; 3 nodes: 2.10 > max price 1.50",
        "why waiting",
        "Ruled out because",
        "2.10 > max price 1.50",
        "worker 0 requeued: node a lost",
    ):
        assert text in result.stdout


@pytest.mark.parametrize(
    ("state", "workers", "said"),
    [
        ("running", ["running", "waiting"], "job j1: stopping (1 worker(s) told to stop)"),
        ("starting", ["placed"], "job j1: stopping (1 worker(s) told to stop)"),
        ("stopped", ["stopped", "stopped"], "job j1: stopped"),
        ("finished", ["finished"], "job j1: already finished; nothing to cancel"),
        ("failed", ["failed"], "job j1: already failed; nothing to cancel"),
    ],
)
def test_cancel_says_what_it_did(
    monkeypatch: pytest.MonkeyPatch, state: str, workers: list[str], said: str
) -> None:
    reply = job(state, workers=len(workers))
    for w, s in zip(reply["workers"], workers, strict=True):
        w["state"] = s
    bus = use(monkeypatch, {CancelJob.SUBJECT: reply})
    result = runner.invoke(app, ["job", "cancel", "j1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == said
    assert [(s, p) for s, p, _ in bus.calls] == [(CancelJob.SUBJECT, {"job_id": "j1"})]
    assert json.loads(runner.invoke(app, ["job", "cancel", "j1", "--json"]).stdout) == reply
