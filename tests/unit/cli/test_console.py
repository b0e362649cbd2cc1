"""`gpufleet console login`: the sign-in link, asked as the CLI's own identity (no NATS)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.main import app
from gpufleet_contracts.console import OpenConsoleSession
from typer.testing import CliRunner

CODE = "c" * 43


def test_login_prints_the_link_of_a_code_opened_for_the_acting_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        asked.append((subject, json.loads(payload)))
        reply = {"code": CODE, "expires_at": 1_900_000_120, "session_expires_at": 1_900_003_600}
        return json.dumps(reply).encode()

    monkeypatch.setattr(client, "send", send)
    runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme"})
    url = "https://console.example:8443/"
    result = runner.invoke(app, ["console", "login", "--url", url, "--hours", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["url"] == f"https://console.example:8443/login?code={CODE}"
    # on the acting account's own subject; the body names no account
    assert asked == [(f"{OpenConsoleSession.SUBJECT}.acme", {"ttl_s": 3600})]
