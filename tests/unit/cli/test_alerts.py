"""`gpufleet alert rule add|list|remove` and `gpufleet alert list` (no NATS): what each sends,
to which subject (an account's, or with --operator / --all-accounts the operators'), and
what it prints."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.alerts import seconds
from gpufleet_cli.client import CliError
from gpufleet_cli.main import app
from gpufleet_contracts import subjects
from gpufleet_contracts.alerts import (
    AddAlertRule,
    AddOperatorAlertRule,
    AlertList,
    AlertRuleView,
    ListAlerts,
    ListAllAlerts,
    RemoveAlertRule,
)
from typer.testing import CliRunner

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})
RULE = AlertRuleView(
    id="rule-1",
    name="hot",
    account="acme",
    query='gpufleet_gpu_temperature_celsius{account="acme"} > 85.0',
    series="gpufleet_gpu_temperature_celsius",
    comparison=">",
    threshold=85,
    for_s=300,
    keep_firing_for_s=0,
).model_dump(mode="json")
ALERTS = AlertList.model_validate(
    {
        "alerts": [
            {
                "id": "a-1",
                "rule_id": "rule-1",
                "rule_name": "hot",
                "state": "firing",
                "labels": {"node": "n1", "gpu": "0"},
                "value": 91,
                "started_at": "2026-01-01T10:00:00Z",
                "fired_at": "2026-01-01T10:05:00Z",
                "account": "acme",
            }
        ]
    }
).model_dump(mode="json")


def replying(monkeypatch: pytest.MonkeyPatch, replies: dict[str, Any]) -> list[tuple[str, Any]]:
    asked: list[tuple[str, Any]] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        base = subject.rsplit(".", 1)[0] if subject.startswith(subjects.RPC) else subject
        asked.append((base, json.loads(payload)))
        return json.dumps(replies[base]).encode()

    monkeypatch.setattr(client, "send", send)
    return asked


def test_rule_add_sends_a_series_rule_with_durations_in_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = replying(monkeypatch, {AddAlertRule.SUBJECT: RULE})
    argv = [
        "alert", "rule", "add", "hot", "--series", "gpufleet_gpu_temperature_celsius",
        "--compare", ">", "--threshold", "85", "--for", "5m", "--keep-firing-for", "1m30s",
        "--match", "gpu=0", "--match", "node=~n.*", "--label", "team=ml",
        "--annotation", "summary=GPU {{ $labels.gpu }} hot",
    ]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    ((subject, body),) = asked
    assert subject == AddAlertRule.SUBJECT
    assert body["for_s"] == 300 and body["keep_firing_for_s"] == 90
    assert body["matchers"] == [
        {"label": "gpu", "op": "=", "value": "0"},
        {"label": "node", "op": "=~", "value": "n.*"},
    ]
    assert body["labels"] == {"team": "ml"} and "account" not in body
    assert "added rule hot" in result.stdout and 'account="acme"' in result.stdout


def test_operator_rules_and_every_accounts_alerts_use_the_admin_subjects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = replying(
        monkeypatch, {AddOperatorAlertRule.SUBJECT: RULE, ListAllAlerts.SUBJECT: ALERTS}
    )
    add = runner.invoke(app, ["alert", "rule", "add", "down", "--expr", "up == 0", "--operator"])
    assert add.exit_code == 0, add.output
    listed = runner.invoke(app, ["alert", "list", "--all-accounts", "--state", "firing"])
    assert listed.exit_code == 0, listed.output
    assert [s for s, _ in asked] == [AddOperatorAlertRule.SUBJECT, ListAllAlerts.SUBJECT]
    assert asked[1][1] == {"limit": 100, "state": "firing"}
    assert "firing" in listed.stdout and "gpu=0,node=n1" in listed.stdout


def test_alert_list_json_and_rule_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    removed = {"id": "rule-1", "name": "hot", "removed": True}
    replying(monkeypatch, {ListAlerts.SUBJECT: ALERTS, RemoveAlertRule.SUBJECT: removed})
    listed = runner.invoke(app, ["alert", "list", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == ALERTS
    gone = runner.invoke(app, ["alert", "rule", "remove", "hot"])
    assert gone.exit_code == 0 and "removed rule hot" in gone.stdout


def test_a_bad_duration_is_refused_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = replying(monkeypatch, {})
    result = runner.invoke(app, ["alert", "rule", "add", "x", "--for", "5 minutes"])
    assert result.exit_code == 2 and asked == []
    assert seconds("1h30m", "--for") == 5400 and seconds("45", "--for") == 45
    with pytest.raises(CliError):
        seconds("m", "--for")
