"""Verified nodes in the CLI (no NATS): `node show` says whether a node may take other
accounts' jobs or why not, when it was checked and what; `node list` marks it; `node
verify` and `admin node-verify` ask for a check now."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.main import app
from typer.testing import CliRunner

from .replies import node_detail, verification

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})

NODE: dict[str, Any] = node_detail(
    node_id="node-box-1",
    minion_id="box-1",
    name="box-1",
    region="lab",
    owner="acme",
    state="active",
    kind="compute",
    provider="physical",
    gpus=[{"index": 0, "model": "H200", "nvml_name": "NVIDIA H200"}],
    simulated=False,
    inventory_source="nvml",
    failed_rules=[],
    last_seen="2025-01-01T10:00:00+00:00",
    history=[],
)


def replying(monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any]) -> list[tuple[str, Any]]:
    asked: list[tuple[str, Any]] = []

    def request(subject: str, payload: bytes, **kw: Any) -> dict[str, Any]:
        asked.append((subject, json.loads(payload)))
        return reply

    monkeypatch.setattr(client, "request", request)
    return asked


def test_show_says_why_a_node_is_not_verified_and_what_was_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = {
        **NODE,
        "verified": False,
        "verification": {
            "verified": False,
            "reason": "GPU 0 (GPU-1): 25.2 GB allocated; a H200 has 141 GB",
            "checked_at": "2025-01-01T10:00:05+00:00",
            "checks": [
                "ok: 1 GPUs, the UUIDs registered",
                "failed: GPU 0 (GPU-1): 25.2 GB allocated; a H200 has 141 GB",
            ],
            "next_check": None,
        },
    }
    replying(monkeypatch, node)
    out = runner.invoke(app, ["node", "show", "box-1"]).stdout
    assert "no (GPU 0 (GPU-1): 25.2 GB allocated; a H200 has 141 GB): its owner's jobs only" in out
    assert "2025-01-01T10:00:05+00:00" in out
    assert "GPU check:" in out
    assert "ok     1 GPUs, the UUIDs registered" in out
    assert "failed GPU 0 (GPU-1): 25.2 GB allocated" in out


def test_show_a_verified_node_and_a_check_on_its_way(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = {
        "sent_at": "2025-01-02T10:00:00+00:00",
        "deadline": "2025-01-02T10:05:00+00:00",
        "why": "due again",
    }
    node = {
        **NODE,
        "verified": True,
        "verification": {
            "verified": True,
            "reason": None,
            "checked_at": "2025-01-01T10:00:05+00:00",
            "checks": [],
            "next_check": None,
            "pending": pending,
        },
    }
    replying(monkeypatch, node)
    out = runner.invoke(app, ["node", "show", "box-1"]).stdout
    assert "yes: its hardware passed gpufleet's GPU check" in out
    assert "asked at 2025-01-02T10:00:00+00:00 (due again), answer due by" in out


def test_list_marks_verified_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [
        {**NODE, "name": "checked", "verified": True},
        {**NODE, "name": "unchecked", "verified": False},
        {**NODE, "name": "storage", "kind": "storage"},  # never checked
    ]
    replying(monkeypatch, {"nodes": nodes})
    out = runner.invoke(app, ["node", "list"]).stdout
    assert "Verified" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert "yes" in rows["checked"] and "no" in rows["unchecked"] and "-" in rows["storage"]


def test_verify_asks_for_a_check_now(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replying(monkeypatch, {**NODE, "verification": verification(verified=False)})
    result = runner.invoke(app, ["node", "verify", "box-1"])
    assert result.exit_code == 0, result.output
    assert asked == [("gpufleet.v1.rpc.provisioner.verify_node", {"node": "box-1"})]
    pending = {"deadline": "2025-01-02T10:05:00+00:00", "sent_at": "x", "why": "y"}
    asked = replying(
        monkeypatch, {**NODE, "verification": verification(verified=False, pending=pending)}
    )
    result = runner.invoke(app, ["admin", "node-verify", "box-1", "--account", "acme"])
    assert result.exit_code == 0, result.output
    assert asked == [
        ("gpufleet.v1.adm.provisioner.verify_node", {"account": "acme", "node": "box-1"})
    ]
    assert "GPU check asked of box-1; answer due by 2025-01-02T10:05:00+00:00" in result.stdout
