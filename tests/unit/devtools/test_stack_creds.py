"""The local stack's credentials (`just up`, the tests): one written by an older release, whose
JWT grants other than this one's would (its inbox not under its account's, where the services
answer), is issued again; a current one is kept as it is."""

from __future__ import annotations

from pathlib import Path

from gpufleet_auth import Creds, permissions
from gpufleet_devstack.nats import NatsServer


def test_a_credential_of_an_older_release_is_issued_again_a_current_one_kept(
    tmp_path: Path,
) -> None:
    server = NatsServer(tmp_path / "nats")
    path = server.creds("user", "dev", account="local")
    current = Creds.read(path)
    assert server.creds("user", "dev", account="local") == path
    assert Creds.read(path) == current  # kept: same key, same JWT

    issuer = server.authority.issuer
    grant = permissions.for_user("local", f"_INBOX.{current.public_key}")
    tags = ("account:local", "user:dev")
    old = Creds(
        issuer.user_jwt(current.public_key, "user:local:dev", grant, tags=tags), current.seed
    )
    old.write(path)
    assert server.creds("user", "dev", account="local") == path
    renewed = Creds.read(path)
    assert renewed.public_key != current.public_key
    assert renewed.inbox_prefix == f"_INBOX.account.local.{renewed.public_key}"
    assert Creds.read(server.creds("operator")) == Creds.read(server.creds("operator"))
