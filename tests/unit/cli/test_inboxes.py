"""Where the CLI's replies come: the inbox its credential may subscribe to, under the acting
account's inboxes (`_INBOX.account.<account>`), the only ones the services answer the
account's requests in; an older credential is refused before anything is sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpufleet_auth import Authority, Creds, permissions
from gpufleet_cli import client
from gpufleet_cli.main import app
from typer.testing import CliRunner


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority.load_or_create(tmp_path / "auth")


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of each connection the CLI opens (none gets through)."""
    seen: list[dict[str, Any]] = []

    async def connect(**kw: Any) -> Any:
        seen.append(kw)
        raise OSError("no server in a unit test")

    monkeypatch.setattr(client.nats, "connect", connect)
    return seen


def job_list(creds: Path, **env: str) -> Any:
    return CliRunner(env={"GPUFLEET_NATS_CREDS": str(creds), **env}).invoke(app, ["job", "list"])


def test_a_user_and_an_operator_acting_for_an_account_take_an_inbox_under_its(
    authority: Authority, tmp_path: Path, connects: list[dict[str, Any]]
) -> None:
    user = authority.issuer.user("acme", "alice")
    operator = authority.issuer.operator()
    job_list(user.write(tmp_path / "alice.creds"))
    job_list(operator.write(tmp_path / "op.creds"), GPUFLEET_ACCOUNT="globex")
    assert [c["inbox_prefix"] for c in connects] == [
        f"_INBOX.account.acme.{user.public_key}",
        f"_INBOX.account.globex.{operator.public_key}",
    ]


def test_a_user_credential_issued_before_account_inboxes_is_refused_with_what_to_do(
    authority: Authority, tmp_path: Path, connects: list[dict[str, Any]]
) -> None:
    """Its JWT lets it subscribe to `_INBOX.<key>.>` only, where no service answers it: the
    CLI says so, and how to get a new one, instead of waiting for answers that never come."""
    fresh = authority.issuer.user("acme", "old")
    grant = permissions.for_user("acme", f"_INBOX.{fresh.public_key}")
    tags = ("account:acme", "user:old")
    old = Creds(
        authority.issuer.user_jwt(fresh.public_key, "user:acme:old", grant, tags=tags), fresh.seed
    )
    assert old.inbox_prefix == f"_INBOX.{fresh.public_key}"  # what the server lets it read
    result = job_list(old.write(tmp_path / "old.creds"))
    assert result.exit_code == 1 and connects == []
    assert "gpufleet admin user add acme old" in result.stderr, result.stderr
