"""A notebook in the CLI (R-JOB-1, no NATS): `job submit --type notebook` needs no command,
`job open` prints its URL with its token (and says on stderr the token is a secret), `job show`
prints its URL and never a token."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpufleet_cli.jobs import BILLING_JOB_COST
from gpufleet_cli.main import app
from gpufleet_contracts.jobs import GetJob, SubmitJob
from gpufleet_contracts.serving import OpenNotebook

from .test_endpoints import job, replying, runner

TOKEN = "tOkEn-tOkEn-tOkEn-tOkEn-tOkEn-tOkEn-tOkEn-t"
URL = "http://j1.localhost:8480"


def notebook(**kw: Any) -> dict[str, Any]:
    spec = {"name": "nb", "type": "notebook", "env": {"JUPYTER_TOKEN": "<secret>"}}
    return job(spec=spec, **kw)


def access(ready: bool = True) -> dict[str, Any]:
    return {"job_id": "j1", "url": f"{URL}/", "token": TOKEN, "ready": ready}


def test_submit_a_notebook_without_a_command(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replying(monkeypatch, {SubmitJob.SUBJECT: {"id": "j1", "state": "queued"}})
    result = runner.invoke(
        app, ["job", "submit", "--type", "notebook", "--gpu-type", "RTX 3090", "-n", "nb"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "j1\n"
    sent = asked[-1][1]["spec"]
    assert sent["type"] == "notebook" and not sent.get("command")


def test_open_prints_the_url_with_its_token_and_says_it_is_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = replying(monkeypatch, {GetJob.SUBJECT: notebook(), OpenNotebook.SUBJECT: access()})
    result = runner.invoke(app, ["job", "open", "j1"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{URL}/lab?token={TOKEN}\n"
    assert "keep it secret" in result.stderr and TOKEN not in result.stderr
    assert "still starting" not in result.stderr
    assert asked[-1] == (OpenNotebook.SUBJECT, {"job_id": "j1"})
    as_json = runner.invoke(app, ["job", "open", "j1", "--json"])
    assert json.loads(as_json.stdout) == access()


def test_open_says_a_notebook_is_still_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    replying(monkeypatch, {GetJob.SUBJECT: notebook(), OpenNotebook.SUBJECT: access(False)})
    result = runner.invoke(app, ["job", "open", "j1"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{URL}/lab?token={TOKEN}\n"
    assert "still starting" in result.stderr


def test_open_reports_the_schedulers_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    why = "notebook j1 is not running yet (queued): it has a URL once a node takes it"
    refused = {"ok": False, "error": {"code": "conflict", "message": why}}
    replying(monkeypatch, {GetJob.SUBJECT: notebook(url=None), OpenNotebook.SUBJECT: refused})
    result = runner.invoke(app, ["job", "open", "j1"])
    assert result.exit_code == 1 and why in result.stderr and not result.stdout
    as_json = runner.invoke(app, ["job", "open", "j1", "--json"])
    assert json.loads(as_json.stdout)["error"]["code"] == "conflict"


def test_show_prints_a_notebooks_url_never_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    replying(
        monkeypatch,
        {GetJob.SUBJECT: notebook(), BILLING_JOB_COST: {"cost": "0", "cost_micro": 0}},
    )
    result = runner.invoke(app, ["job", "show", "j1"])
    assert result.exit_code == 0, result.output
    assert URL in result.stdout and TOKEN not in result.stdout
