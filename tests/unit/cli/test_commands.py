"""Nodes, billing, health, dlq and error rendering of the CLI (no NATS)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpufleet_cli import client, logs
from gpufleet_cli.billing import BALANCE, ENTRIES
from gpufleet_cli.client import CliError, ServiceError, StreamRecord
from gpufleet_cli.main import app
from gpufleet_cli.nodes import LIST_NODES, SHOW_NODE
from gpufleet_cli.views import TIMES
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import ListJobs
from typer.testing import CliRunner

from .replies import job, node, node_detail

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})

GPU = {
    "index": 0,
    "uuid": "GPU-0",
    "model": "RTX 3090",
    "nvml_name": "NVIDIA GeForce RTX 3090",
    "memory_mb": 24576,
}
NODES = {
    "nodes": [
        node(
            node_id="n1",
            minion_id="m1",
            name="box-a",
            region="eu-west",
            owner="acme",
            state="active",
            gpus=[GPU, {**GPU, "index": 1}],
            simulated=True,
            last_seen="2025-01-01T10:00:00+00:00",
        ),
        node(
            node_id="n2",
            minion_id="m2",
            name="box-b",
            region="us-east",
            owner="acme",
            state="lost",
            gpus=[{**GPU, "model": None, "nvml_name": "Mystery GPU"}],
            simulated=False,
            last_seen=None,
        ),
    ]
}


def replying(monkeypatch: pytest.MonkeyPatch, replies: dict[str, Any]) -> list[str]:
    asked: list[str] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        base, account = subject.rsplit(".", 1)  # requests go to the acting account's subject
        assert account == "acme", subject
        asked.append(base)
        return json.dumps(replies[base]).encode()

    monkeypatch.setattr(client, "send", send)
    return asked


def test_node_list_table(monkeypatch: pytest.MonkeyPatch) -> None:
    replying(monkeypatch, {LIST_NODES: NODES})
    result = runner.invoke(app, ["node", "list"])
    assert result.exit_code == 0, result.output
    row_a = next(line for line in result.stdout.splitlines() if "box-a" in line)
    for text in ("eu-west", "active", f"2{TIMES}RTX 3090", "yes"):
        assert text in row_a
    row_b = next(line for line in result.stdout.splitlines() if "box-b" in line)
    for text in ("lost", f"1{TIMES}Mystery GPU", "no"):
        assert text in row_b


def test_node_list_json_is_the_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replying(monkeypatch, {LIST_NODES: NODES})
    result = runner.invoke(app, ["node", "list", "--json"])
    assert json.loads(result.stdout) == NODES
    assert asked == [subjects.rpc("provisioner", "list_nodes")]


def test_node_show_says_simulated_and_why_a_node_has_no_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bare = node_detail(
        **{
            **NODES["nodes"][1],
            "state": "active",
            "gpus": [],
            "inventory_source": "nvml: no NVIDIA driver (Driver Not Loaded)",
        }
    )
    replying(monkeypatch, {SHOW_NODE: bare})
    lines = runner.invoke(app, ["node", "show", "box-b"]).stdout.splitlines()
    assert any("simulated" in line and "False" in line for line in lines)
    assert any("gpus" in line and "none" in line for line in lines)
    assert any("nvml: no NVIDIA driver (Driver Not Loaded)" in line for line in lines)
    sim = node_detail(**{**NODES["nodes"][0], "inventory_source": "/pkg/simulated/2x-rtx3090.json"})
    replying(monkeypatch, {SHOW_NODE: sim})
    lines = runner.invoke(app, ["node", "show", "box-a"]).stdout.splitlines()
    assert any("simulated" in line and "True" in line for line in lines)
    assert json.loads(runner.invoke(app, ["node", "show", "box-a", "--json"]).stdout) == sim


def test_billing_balance_and_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    balance = {
        "account": "acme",
        "balance": "-0.000139",
        "balance_micro": -139,
        "entries": 3,
        "earnings_unpaid": "0.000000",
        "earnings_unpaid_micro": 0,
    }
    entries = {
        "entries": [
            {
                "key": "k",
                "account": "acme",
                "kind": "usage",
                "amount": "-0.000139",
                "amount_micro": -139,
                "job_id": "j1",
                "worker": 0,
                "at": "2025-01-01T10:00:00+00:00",
                "memo": "m",
            }
        ]
    }
    replying(monkeypatch, {BALANCE: balance, ENTRIES: entries})
    result = runner.invoke(app, ["billing", "balance"])
    assert result.stdout.strip() == "balance: -0.000139 credits (3 entries)"
    assert json.loads(runner.invoke(app, ["billing", "balance", "--json"]).stdout) == balance
    table = runner.invoke(app, ["billing", "entries", "--limit", "5"])
    assert table.exit_code == 0
    assert "-0.000139" in table.stdout and "usage" in table.stdout


def test_job_list(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = {
        "jobs": [
            job(
                id="j1",
                name="n",
                state="queued",
                rate=None,
                spec={"gpu_count": 2, "gpu_types": ["T4"], "workers": 1},
                queued_at="2025-01-01T10:00:00+00:00",
            )
        ]
    }
    replying(monkeypatch, {ListJobs.SUBJECT: jobs})
    result = runner.invoke(app, ["job", "list"])
    assert "waiting for GPUs" in result.stdout and f"2{TIMES}T4" in result.stdout
    assert json.loads(runner.invoke(app, ["job", "list", "--json"]).stdout) == jobs


def test_service_error_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = {"ok": False, "error": {"code": "internal", "message": "KeyError", "fields": []}}
    replying(monkeypatch, {BALANCE: refused})
    result = runner.invoke(app, ["billing", "balance"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "error (internal): KeyError" in result.stderr
    as_json = runner.invoke(app, ["billing", "balance", "--json"])
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout) == refused


def test_service_error_object() -> None:
    exc = ServiceError(
        {
            "ok": False,
            "error": {"code": "invalid", "message": "m", "fields": [{"field": "f", "rule": "R"}]},
        }
    )
    assert (exc.code, exc.message, exc.exit_code) == ("invalid", "m", 2)
    assert exc.fields == [{"field": "f", "rule": "R"}]
    with pytest.raises(ServiceError):
        client.parse_reply("s", b'{"ok": false, "error": {"code": "not_found", "message": "x"}}')
    assert client.parse_reply("s", b'{"ok": true, "id": "j"}') == {"ok": True, "id": "j"}


def test_no_responder_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def send(subject: str, *_: Any) -> bytes:
        raise client._no_answer(subject)

    monkeypatch.setattr(client, "send", send)
    result = runner.invoke(app, ["node", "list", "--json"], env={"GPUFLEET_NATS_URL": "nats://h:1"})
    assert result.exit_code == 1
    message = json.loads(result.stdout)["error"]["message"]
    assert message == (
        f"no service answered on {LIST_NODES}.acme "
        "(is `just up` running? GPUFLEET_NATS_URL=nats://h:1)"
    )


def test_cannot_connect() -> None:
    result = runner.invoke(
        app, ["billing", "balance", "--json"], env={"GPUFLEET_NATS_URL": "nats://127.0.0.1:1"}
    )
    assert result.exit_code == 1
    reply = json.loads(result.stdout)
    assert reply["error"]["message"].startswith("cannot connect to NATS at nats://127.0.0.1:1")


def test_health_marks_down_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def request_many(calls: list[tuple[str, bytes]], timeout: float) -> list[Any]:
        assert timeout == 2.0
        assert [s for s, _ in calls] == [
            subjects.rpc(s, "health")
            for s in ("scheduler", "provisioner", "billing", "device-fleet", "datastore")
        ]
        ok = {"status": "ok", "version": "0.1.0", "collections": ["jobs"]}
        return [
            {**ok, "service": "scheduler"},
            {**ok, "service": "provisioner"},
            {**ok, "service": "billing"},
            CliError("no answer"),
            {**ok, "service": "datastore"},
        ]

    monkeypatch.setattr(client, "request_many", request_many)
    result = runner.invoke(app, ["health", "--json"])
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["ok"] is False
    assert [r["status"] for r in out["services"]] == ["ok", "ok", "ok", "down", "ok"]
    table = runner.invoke(app, ["health"])
    assert table.exit_code == 1
    assert "device-fleet" in table.stdout and "down" in table.stdout


def _letter(service: str, seq: int, account: str | None = "acme") -> dict[str, Any]:
    return {
        "seq": seq,
        "service": service,
        "subject": f"gpufleet.v1.rpc.{service}.x.acme",
        "account": account,
        "reason": "invalid",
        "errors": [{"field": "rate", "message": "bad"}],
        "headers": {},
        "payload": {},
        "at": "2025-01-01T10:00:00+00:00",
    }


SERVICES = ("scheduler", "provisioner", "billing", "device-fleet", "datastore")


def test_dlq_list_asks_every_service_for_the_account_and_merges_newest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[Any] = []

    def request_many(
        calls: list[tuple[str, bytes]], timeout: float, *, ce_type: str | None = None
    ) -> list[Any]:
        sent.append((calls, ce_type))
        by_service = {
            "billing": [_letter("billing", 9), _letter("billing", 3)],
            "scheduler": [_letter("scheduler", 7)],
        }
        return [{"service": svc, "dead_letters": by_service.get(svc, [])} for svc in SERVICES]

    monkeypatch.setattr(client, "request_many", request_many)
    result = runner.invoke(app, ["dlq", "list", "--limit", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "dead_letters": [_letter("billing", 9), _letter("scheduler", 7)]
    }
    calls, ce_type = sent[0]
    assert [s for s, _ in calls] == [f"gpufleet.v1.rpc.{svc}.dead_letters.acme" for svc in SERVICES]
    assert all(json.loads(p) == {"limit": 2} for _, p in calls)
    assert ce_type == "gpufleet.dead_letters.list.v1"
    table = runner.invoke(app, ["dlq", "list", "--limit", "10"])
    assert "rate: bad" in table.stdout

    runner.invoke(app, ["dlq", "list", "--all-accounts", "--json"])
    assert [s for s, _ in sent[-1][0]] == [
        f"gpufleet.v1.adm.{svc}.dead_letters" for svc in SERVICES
    ]


def test_dlq_list_shows_what_it_got_and_exits_1_when_a_service_is_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def request_many(
        calls: list[tuple[str, bytes]], timeout: float, *, ce_type: str | None = None
    ) -> list[Any]:
        return [
            CliError("no answer") if svc == "billing" else {"dead_letters": []}
            for svc in SERVICES[:-1]
        ] + [{"dead_letters": [_letter("datastore", 4)]}]

    monkeypatch.setattr(client, "request_many", request_many)
    result = runner.invoke(app, ["dlq", "list", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"dead_letters": [_letter("datastore", 4)]}
    assert "billing: no answer" in result.stderr

    monkeypatch.setattr(
        client, "request_many", lambda calls, timeout, ce_type=None: [CliError("no")] * 5
    )
    silent = runner.invoke(app, ["dlq", "list", "--json"])
    assert silent.exit_code == 1
    assert json.loads(silent.stdout)["ok"] is False


def test_line_printer_tags_whole_lines() -> None:
    written: list[str] = []
    printer = logs.LinePrinter(prefix=True, write=written.append)
    printer(StreamRecord(subjects.log("m1", "j", 0), b"a\nb", 1))
    printer(StreamRecord(subjects.log("m1", "j", 1), "é\n".encode()[:1], 2))  # split UTF-8
    printer(StreamRecord(subjects.log("m1", "j", 0), b"c\n", 3))
    printer(StreamRecord(subjects.log("m1", "j", 1), "é\n".encode()[1:], 4))
    printer.close()
    assert "".join(written) == "[w0] a\n[w0] bc\n[w1] é\n"


@pytest.mark.parametrize("as_json", [False, True])
def test_admin_node_token_with_out_writes_the_token_and_never_prints_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, as_json: bool
) -> None:
    secret = "gfjt1.SECRET-TOKEN"

    def request(subject: str, payload: bytes, **kw: Any) -> dict[str, Any]:
        assert subject == subjects.admin("provisioner", "issue_join_token")
        return {"minion_id": "m1", "region": "lab", "expires_at": 1, "token": secret}

    monkeypatch.setattr(client, "request", request)
    out = tmp_path / "m1.token"
    args = ["admin", "node-token", "m1", "--account", "acme", "--region", "lab", "--out", str(out)]
    result = runner.invoke(app, [*args, "--json"] if as_json else args)
    assert result.exit_code == 0, result.output
    assert out.read_text().strip() == secret
    assert secret not in result.output
    if as_json:
        assert json.loads(result.output) == {"minion_id": "m1", "written_to": str(out)}
    else:
        assert str(out) in result.output.replace("\n", "")


def test_admin_account_remove_asks_for_confirmation_then_removes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    def request(subject: str, payload: bytes, **kw: Any) -> dict[str, Any]:
        sent.append((subject, json.loads(payload)))
        return {"account": "beta", "removed_at": "2025-01-02T10:00:00Z", "users": ["al"]}

    monkeypatch.setattr(client, "request", request)
    declined = runner.invoke(app, ["admin", "account", "remove", "beta"], input="n\n")
    assert declined.exit_code == 1 and sent == []
    result = runner.invoke(app, ["admin", "account", "remove", "beta"], input="y\n")
    assert result.exit_code == 0, result.output
    assert "account beta removed (users revoked: al)" in result.output
    assert sent == [(subjects.admin("provisioner", "remove_account"), {"account": "beta"})]
    assert runner.invoke(app, ["admin", "account", "remove", "beta", "--yes"]).exit_code == 0
