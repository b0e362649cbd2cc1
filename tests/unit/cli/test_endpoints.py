"""`gpufleet endpoint key create|list|revoke`, `job open`, an endpoint in `job show` and
`job submit --server-command` (no NATS): a key is printed once, alone, and never again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.jobs import BILLING_JOB_COST
from gpufleet_cli.main import app
from gpufleet_contracts.jobs import GetJob, SubmitJob
from gpufleet_contracts.serving import CreateEndpointKey, ListEndpointKeys, RevokeEndpointKey
from typer.testing import CliRunner

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})
SECRET = "S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t-S"
KEY = f"gfk_0123456789ab_{SECRET}"
VIEW = {
    "key_id": "0123456789ab",
    "job_id": "j1",
    "name": "ci",
    "created_at": "2026-11-27T12:00:00+00:00",
    "revoked_at": None,
}
URL = "http://j1.localhost:8480"
ROUTES = [
    {
        "verb": "POST",
        "path": "/sum",
        "file": "app.py",
        "function": "add",
        "positional": False,
        "body": [
            {"name": "a", "type": "integer", "optional": False, "default": None},
            {"name": "b", "type": "integer", "optional": True, "default": "2"},
        ],
    }
]


def replying(monkeypatch: pytest.MonkeyPatch, replies: dict[str, Any]) -> list[tuple[str, Any]]:
    asked: list[tuple[str, Any]] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        base, account = subject.rsplit(".", 1)
        assert account == "acme", subject
        asked.append((base, json.loads(payload)))
        if base not in replies:
            raise client.CliError(f"no service answered on {base}")
        return json.dumps(replies[base]).encode()

    monkeypatch.setattr(client, "send", send)
    monkeypatch.setattr(client, "read_logs", lambda job_id: [])
    return asked


def job(state: str = "running", url: str | None = URL, **kw: Any) -> dict[str, Any]:
    spec = {"name": "ep", "type": "endpoint", "endpoint": {"routes": ROUTES}}
    return {
        "id": "j1",
        "name": "ep",
        "project": "default",
        "owner": "acme",
        "creator": "acme",
        "state": state,
        "spec": {**spec, **kw.pop("spec", {})},
        "history": [{"state": "queued", "at": "2026-11-27T12:00:00+00:00", "reason": None}],
        "notes": [],
        "workers": [{"index": 0, "state": "running", "node": "m1"}],
        "url": url,
        **kw,
    }


def test_create_prints_the_key_alone_once_and_warns_on_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = replying(monkeypatch, {CreateEndpointKey.SUBJECT: {"view": VIEW, "key": KEY}})
    result = runner.invoke(app, ["endpoint", "key", "create", "j1", "--name", "ci"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{KEY}\n"
    assert "not shown again" in result.stderr and "0123456789ab (ci)" in result.stderr
    assert asked == [(CreateEndpointKey.SUBJECT, {"job_id": "j1", "name": "ci"})]
    as_json = runner.invoke(app, ["endpoint", "key", "create", "j1", "--json"])
    assert json.loads(as_json.stdout) == {"view": VIEW, "key": KEY}


def test_list_and_revoke_show_key_ids_never_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    revoked = {**VIEW, "revoked_at": "2026-11-27T12:05:00+00:00"}
    asked = replying(
        monkeypatch,
        {ListEndpointKeys.SUBJECT: {"keys": [VIEW, revoked]}, RevokeEndpointKey.SUBJECT: revoked},
    )
    listed = runner.invoke(app, ["endpoint", "key", "list", "j1"])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.count("0123456789ab") == 2 and "gfk_" not in listed.stdout
    assert json.loads(runner.invoke(app, ["endpoint", "key", "list", "j1", "--json"]).stdout) == {
        "keys": [VIEW, revoked]
    }
    gone = runner.invoke(app, ["endpoint", "key", "revoke", "j1", "0123456789ab"])
    assert gone.exit_code == 0 and "revoked key 0123456789ab (ci) of endpoint j1" in gone.stdout
    assert asked[-1] == (RevokeEndpointKey.SUBJECT, {"job_id": "j1", "key_id": "0123456789ab"})


def test_a_refusal_is_reported_with_its_exit_status(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = {"ok": False, "error": {"code": "not_found", "message": "job j9 not found"}}
    replying(monkeypatch, {CreateEndpointKey.SUBJECT: missing})
    result = runner.invoke(app, ["endpoint", "key", "create", "j9"])
    assert result.exit_code == 1 and "job j9 not found" in result.stderr and not result.stdout


def test_open_prints_the_url_and_a_request_with_the_first_routes_required_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replying(monkeypatch, {GetJob.SUBJECT: job()})
    result = runner.invoke(app, ["job", "open", "j1"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{URL}\n"
    curl = f'curl -H "Authorization: Bearer $KEY" -X POST {URL}/sum -d \'{{"a": 1}}\''
    assert curl in result.stderr
    out = json.loads(runner.invoke(app, ["job", "open", "j1", "--json"]).stdout)
    assert out == {"id": "j1", "url": URL, "example": curl}
    server = job(spec={"endpoint": {"server_command": ["python3", "-m", "http.server", "80"]}})
    replying(monkeypatch, {GetJob.SUBJECT: server})
    out = json.loads(runner.invoke(app, ["job", "open", "j1", "--json"]).stdout)
    assert out["example"] == f'curl -H "Authorization: Bearer $KEY" {URL}/'


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (job("queued", None, workers=[{"index": 0, "state": "waiting"}]), "not running yet"),
        (job("finished", None), "has ended (finished): its URL is closed"),
        (job(url=None, spec={"type": "training"}), "is a training job: only endpoints"),
        (job(url=None), "serves no URL"),
    ],
)
def test_open_without_a_url_says_why_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any], why: str
) -> None:
    replying(monkeypatch, {GetJob.SUBJECT: reply})
    result = runner.invoke(app, ["job", "open", "j1"])
    assert result.exit_code == 1 and why in result.stderr and not result.stdout
    as_json = runner.invoke(app, ["job", "open", "j1", "--json"])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["error"]["code"] == "no_url"


def test_show_prints_the_url_cold_start_and_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = job(
        cold_start={"placed": 0.0, "image_ready": 0.8, "first_answer": 2.25},
        requests=12,
        errors=1,
        bytes_in=1200,
        bytes_out=2_500_000,
    )
    replying(monkeypatch, {GetJob.SUBJECT: shown, BILLING_JOB_COST: {"cost": "0", "cost_micro": 0}})
    result = runner.invoke(app, ["job", "show", "j1"])
    assert result.exit_code == 0, result.output
    assert URL in result.stdout
    assert "image_ready 0.8s, first_answer 2.25s" in result.stdout
    assert "12 (1 errors), 1.2 kB in, 2.5 MB out" in result.stdout


def test_submit_server_command_replaces_the_files_routes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = replying(monkeypatch, {SubmitJob.SUBJECT: {"id": "j1", "state": "queued"}})
    f = tmp_path / "ep.yaml"
    f.write_text(
        "name: ep\ntype: endpoint\ngpu_types: [RTX 3090]\n"
        "model: {source: git, path: 'https://git.example/m.git'}\n"
        f"endpoint: {{routes: {json.dumps(ROUTES)}}}\n"
    )
    from_file = runner.invoke(app, ["job", "submit", "-f", str(f)])
    assert from_file.exit_code == 0, from_file.output
    assert asked[-1][1]["spec"]["endpoint"]["routes"][0]["path"] == "/sum"
    cmd = "python3 -m http.server 80"
    flags = ["job", "submit", "-f", str(f), "--server-command", cmd]
    result = runner.invoke(app, flags)
    assert result.exit_code == 0, result.output
    endpoint = asked[-1][1]["spec"]["endpoint"]
    assert endpoint["server_command"] == ["python3", "-m", "http.server", "80"]
    assert not endpoint.get("routes")
    bad = runner.invoke(app, ["job", "submit", "--type", "endpoint", "--server-command", "'x"])
    assert bad.exit_code == 2 and "--server-command" in bad.stderr
    probed = runner.invoke(app, [*flags, "--health-path", "/ready"])
    assert probed.exit_code == 0, probed.output
    assert asked[-1][1]["spec"]["endpoint"]["health_path"] == "/ready"
    routes_probed = runner.invoke(app, ["job", "submit", "-f", str(f), "--health-path", "/x"])
    assert routes_probed.exit_code == 2 and "health_path is for a manual" in routes_probed.stderr
    assert "needs a command" not in routes_probed.stderr  # not told besides
