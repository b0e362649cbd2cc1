"""What a new user meets first (issue 25), in the CLI without NATS: maintenance on or off,
removed nodes left out of `node list`, and an operator's `job list --all-accounts`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpufleet_auth import Authority
from gpufleet_cli import client
from gpufleet_cli.main import app
from gpufleet_cli.nodes import LIST_NODES, SET_MAINTENANCE
from gpufleet_contracts import subjects
from typer.testing import CliRunner

from .replies import node_detail

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})

NODE = node_detail(
    node_id="node-m1",
    minion_id="m1",
    name="box",
    region="lab",
    owner="acme",
    state="maintenance",
    gpus=[],
    simulated=False,
    history=[],
)


def job(job_id: str, owner: str) -> dict[str, Any]:
    return {
        "id": job_id,
        "name": f"job-{owner}",
        "project": "default",
        "owner": owner,
        "creator": owner,
        "state": "queued",
        "spec": {"gpu_types": ["RTX 3090"], "gpu_count": 1, "workers": 1},
        "history": [],
        "notes": [],
        "workers": [],
        "queued_at": "2025-01-01T10:00:00+00:00",
    }


def replying(monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every request sent (subject as sent, body), each answered with `reply`."""
    sent: list[tuple[str, Any]] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        sent.append((subject, json.loads(payload)))
        return json.dumps(reply).encode()

    monkeypatch.setattr(client, "send", send)
    return sent


def test_maintenance_says_on_or_off_and_an_unchanged_node_is_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = replying(monkeypatch, {**NODE, "changed": True})
    assert runner.invoke(app, ["node", "maintenance", "box", "on"]).exit_code == 0
    assert sent == [(f"{SET_MAINTENANCE}.acme", {"node": "box", "maintenance": True})]
    result = runner.invoke(app, ["node", "maintenance", "box", "off"])
    assert result.exit_code == 0 and "already" not in result.stderr
    assert sent[-1][1] == {"node": "box", "maintenance": False}

    replying(monkeypatch, {**NODE, "changed": False})
    again = runner.invoke(app, ["node", "maintenance", "box", "on"])
    assert again.exit_code == 0
    assert "box is already in maintenance: nothing changed" in again.stderr


@pytest.mark.parametrize("args", [["box"], ["box", "toggle"], ["box", "ON"]])
def test_maintenance_without_on_or_off_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    sent = replying(monkeypatch, NODE)
    result = runner.invoke(app, ["node", "maintenance", *args])
    assert result.exit_code == 2 and sent == []


def test_node_list_leaves_removed_nodes_out_unless_all(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = replying(monkeypatch, {"nodes": []})
    runner.invoke(app, ["node", "list"])
    runner.invoke(app, ["node", "list", "--all"])
    assert sent == [
        (f"{LIST_NODES}.acme", {"include_removed": False}),
        (f"{LIST_NODES}.acme", {"include_removed": True}),
    ]


def test_job_list_all_accounts_asks_the_operators_subject(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    operator = Authority.load_or_create(tmp_path / "auth").issuer.operator()
    env = {"GPUFLEET_NATS_CREDS": str(operator.write(tmp_path / "op.creds")), "COLUMNS": "200"}
    jobs = [job("j-2", "bob"), job("j-1", "acme")]
    sent = replying(monkeypatch, {"jobs": jobs})
    result = CliRunner(env=env).invoke(app, ["job", "list", "--all-accounts", "--limit", "5"])
    assert result.exit_code == 0, result.output
    admin = subjects.admin("scheduler", "list_all_jobs")  # no account token
    assert sent == [(admin, {"limit": 5, "account": None, "state": None})]
    assert "j-1" in result.stdout and "j-2" in result.stdout
    as_json = CliRunner(env=env).invoke(app, ["job", "list", "--all-accounts", "--json"])
    assert [(j["id"], j["owner"]) for j in json.loads(as_json.stdout)["jobs"]] == [
        ("j-2", "bob"),
        ("j-1", "acme"),
    ]


def test_an_operator_without_an_account_is_told_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    operator = Authority.load_or_create(tmp_path / "auth").issuer.operator()
    env = {"GPUFLEET_NATS_CREDS": str(operator.write(tmp_path / "op.creds"))}
    sent = replying(monkeypatch, {"jobs": []})
    result = CliRunner(env=env).invoke(app, ["job", "list"])
    assert result.exit_code == 1 and sent == []
    assert "GPUFLEET_ACCOUNT=<account>" in result.stderr
    assert "--all-accounts" in result.stderr
    assert "no identity" not in result.stderr
    nobody = CliRunner(env={"GPUFLEET_CONFIG_DIR": str(tmp_path / "cfg")})
    assert "no identity" in nobody.invoke(app, ["job", "list"]).stderr


def test_all_accounts_refused_to_a_user_says_it_is_for_operators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def send(*_: Any, **__: Any) -> bytes:
        raise client.CliError("this identity may not publish to ...", "forbidden")

    monkeypatch.setattr(client, "send", send)
    result = runner.invoke(app, ["job", "list", "--all-accounts"])
    assert result.exit_code == 1 and "--all-accounts is for operators" in result.stderr


def test_submit_takes_a_short_gpu_type_and_sends_the_catalogue_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = replying(monkeypatch, {"id": "j1", "state": "queued", "queue_reason": "none free"})
    args = ["job", "submit", "--name", "n", "--gpu-type", "h100", "--gpu-type", "3090", "--"]
    result = runner.invoke(app, [*args, "true"])
    assert result.exit_code == 0, result.output
    assert sent[0][1]["spec"]["gpu_types"] == ["H100 80GB", "RTX 3090"]


def test_submit_refuses_an_ambiguous_gpu_type_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = replying(monkeypatch, {})
    args = ["job", "submit", "--name", "n", "--gpu-type", "A100", "--json", "--"]
    result = runner.invoke(app, [*args, "true"])
    assert result.exit_code == 2 and sent == []
    [field] = json.loads(result.stdout)["error"]["fields"]
    assert (field["rule"], field["valid"]) == ("R-JOB-2", "A100 40GB, A100 80GB")
