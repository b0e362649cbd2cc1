"""`gpufleet key add|list|remove` (no NATS): values come from a prompt or a file, never
from the command line, and are never printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.keys import ATTACH, LIST, REMOVE
from gpufleet_cli.main import app
from typer.testing import CliRunner

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})
VALUE = "hf-v4lue-typed"
VIEW = {
    "type": "huggingface",
    "fields": ["token"],
    "fingerprint": "sha256:0123456789abcdef",
    "created_at": "2025-01-01T10:00:00+00:00",
    "updated_at": "2025-01-01T10:00:00+00:00",
}


def replying(monkeypatch: pytest.MonkeyPatch, replies: dict[str, Any]) -> list[tuple[str, Any]]:
    asked: list[tuple[str, Any]] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        base, account = subject.rsplit(".", 1)
        assert account == "acme", subject
        asked.append((base, json.loads(payload)))
        return json.dumps(replies[base]).encode()

    monkeypatch.setattr(client, "send", send)
    return asked


def test_add_prompts_without_echo_and_prints_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replying(monkeypatch, {ATTACH: VIEW})
    result = runner.invoke(app, ["key", "add", "huggingface"], input=f"{VALUE}\n")
    assert result.exit_code == 0, result.output
    assert asked == [(ATTACH, {"type": "huggingface", "secret": {"token": VALUE}})]
    assert VALUE not in result.output
    assert "attached huggingface key" in result.stdout and "sha256:0123" in result.stdout


def test_add_reads_a_file_or_stdin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked = replying(monkeypatch, {ATTACH: {**VIEW, "type": "docker"}})
    f = tmp_path / "docker.json"
    f.write_text(json.dumps({"username": "me", "password": VALUE}))
    assert runner.invoke(app, ["key", "add", "docker", "--from-file", str(f)]).exit_code == 0
    stdin = json.dumps({"username": "me", "password": VALUE})
    result = runner.invoke(app, ["key", "add", "docker", "--from-file", "-"], input=stdin)
    assert result.exit_code == 0, result.output
    want = (ATTACH, {"type": "docker", "secret": {"username": "me", "password": VALUE}})
    assert asked == [want, want]


def test_a_bad_file_is_invalid_input_without_its_content(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = replying(monkeypatch, {})
    f = tmp_path / "k.json"
    f.write_text(f"token={VALUE}")
    result = runner.invoke(app, ["key", "add", "huggingface", "--from-file", str(f)])
    assert result.exit_code == 2 and VALUE not in result.output
    f.write_text(json.dumps({"token": 1}))
    assert runner.invoke(app, ["key", "add", "huggingface", "--from-file", str(f)]).exit_code == 2
    assert runner.invoke(app, ["key", "add", "vault"], input="x\n").exit_code == 2
    assert asked == []


def test_a_value_is_never_an_argument() -> None:
    result = runner.invoke(app, ["key", "add", "huggingface", VALUE])
    assert result.exit_code == 2  # no such argument: nothing sent


def test_list_and_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replying(monkeypatch, {LIST: {"keys": [VIEW]}, REMOVE: VIEW})
    listed = runner.invoke(app, ["key", "list"])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if "huggingface" in line)
    assert "token" in row and "sha256:0123456789abcdef" in row
    removed = runner.invoke(app, ["key", "remove", "huggingface"])
    assert "removed huggingface key" in removed.stdout
    assert asked == [(LIST, {}), (REMOVE, {"type": "huggingface"})]
