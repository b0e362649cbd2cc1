"""gpufleet_auth: JWTs, credentials, join tokens and the permission table (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import nkeys
import pytest
from gpufleet_auth import Authority, Creds, jwt, permissions
from gpufleet_auth.creds import new_key, public
from gpufleet_auth.permissions import covered, matches, overlaps
from gpufleet_auth.tokens import JoinToken, JoinTokenError


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority.load_or_create(tmp_path_factory.mktemp("auth"))


def test_a_jwt_verifies_and_a_tampered_one_does_not() -> None:
    issuer = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    token = jwt.encode(issuer, "UABC", "x", {"type": "user"})
    claims = jwt.decode(token)
    assert claims["iss"] == public(issuer) and claims["nats"]["version"] == 2
    head, body, sig = token.split(".")
    forged = json.loads(jwt._unb64(body))
    forged["name"] = "admin"
    tampered = f"{head}.{jwt._b64(json.dumps(forged).encode())}.{sig}"
    with pytest.raises(jwt.JwtError):
        jwt.decode(tampered)


def test_user_credentials_carry_their_account_and_only_its_subjects(authority: Authority) -> None:
    creds = authority.issuer.user("acme", "alice")
    assert creds.tag("account") == "acme" and creds.kind == "user"
    nats = jwt.decode(creds.jwt)["nats"]
    assert nats["issuer_account"] == authority.account
    assert nats["pub"]["allow"] == [
        "gpufleet.v1.rpc.*.*.acme",
        "gpufleet.v1.cmd.scheduler.acme.enqueue_job",
    ]
    assert nats["sub"]["allow"] == [f"_INBOX.account.acme.{creds.public_key}.>"]
    again = Creds.parse(creds.text())
    assert again == creds and again.inbox_prefix == f"_INBOX.account.acme.{creds.public_key}"


def test_each_identity_s_inbox_is_under_the_scope_its_subjects_prove(authority: Authority) -> None:
    """A user's inbox is under its account's inboxes, a node's and a join token's under their
    minion id's; a service's and an operator's are their keys'. The inbox a client takes is
    the one its JWT lets it subscribe to; an operator acting for an account takes one under
    that account's (it may subscribe anywhere), anyone else keeps its own."""
    from gpufleet_auth.creds import new_user_key

    user = authority.issuer.user("acme", "alice")
    node_key = new_user_key()
    token = authority.issuer.node("m1", public(node_key), account="acme", region="r")
    node = Creds(token, node_key.seed.decode())
    enrol = authority.issuer.enroll("m1", 60)
    service = authority.issuer.service("scheduler")
    operator = authority.issuer.operator()
    assert node.inbox_prefix == f"_INBOX.node.m1.{public(node_key)}"
    assert jwt.decode(node.jwt)["nats"]["sub"]["allow"][-1] == f"{node.inbox_prefix}.>"
    assert enrol.inbox_prefix == f"_INBOX.enroll.m1.{enrol.public_key}"
    assert service.inbox_prefix == f"_INBOX.{service.public_key}"
    assert operator.inbox_prefix == f"_INBOX.{operator.public_key}"
    assert operator.acting_inbox("acme") == f"_INBOX.account.acme.{operator.public_key}"
    assert operator.acting_inbox(None) == operator.inbox_prefix
    assert user.acting_inbox("globex") == user.inbox_prefix  # a user acts for its own only
    assert operator.connect_options("acme")["inbox_prefix"] == operator.acting_inbox("acme")


def test_secret_files_are_private(tmp_path: Path, authority: Authority) -> None:
    path = authority.issuer.operator().write(tmp_path / "x" / "op.creds")
    assert path.stat().st_mode & 0o777 == 0o600
    assert all(
        (authority.directory / f).stat().st_mode & 0o777 == 0o600
        for f in ("operator.nk", "account-signing.nk", "operator-signing.nk")
    )


def test_revocations_are_in_a_newer_account_jwt(authority: Authority) -> None:
    preload = jwt.decode(authority.issuer.account_jwt(issued_at=authority.created))
    pushed = jwt.decode(authority.issuer.account_jwt({"UKEY": authority.created + 5}))
    assert pushed["nats"]["revocations"] == {"UKEY": authority.created + 5}
    assert preload["iat"] == authority.created  # the same preload at every server start
    assert "revocations" not in preload["nats"]


def test_a_join_token_round_trips_and_a_damaged_one_is_refused(authority: Authority) -> None:
    token = JoinToken(authority.issuer.enroll("gpu-01", 60), "s" * 32, "gpu-01")
    back = JoinToken.parse(token.text())
    assert back.minion_id == "gpu-01" and back.secret == "s" * 32
    assert back.creds.kind == "enroll"
    assert "exp" in jwt.decode(back.creds.jwt)
    for bad in ("", "GFJ1.", "GFJ1.!!!", "nats://x", token.text()[:-10]):
        with pytest.raises(JoinTokenError):
            JoinToken.parse(bad)


@pytest.mark.parametrize(
    ("subject", "pattern", "expected"),
    [
        ("a.b.c", "a.*.c", True),
        ("a.b.c", "a.>", True),
        ("a", "a.>", False),
        ("a.b.c", "a.b", False),
        ("a.b", "a.b.c", False),
        ("a.b.c", "a.*", False),
    ],
)
def test_nats_wildcards(subject: str, pattern: str, expected: bool) -> None:
    assert matches(subject, pattern) is expected


def test_a_wildcard_subscription_needs_a_pattern_covering_all_of_it() -> None:
    assert covered("gpufleet.v1.rpc.scheduler.*.*", ("gpufleet.v1.rpc.scheduler.>",))
    assert not covered("gpufleet.v1.rpc.>", ("gpufleet.v1.rpc.scheduler.>",))
    assert not covered("gpufleet.v1.evt.>", ("gpufleet.v1.evt.job.*",))
    assert overlaps("gpufleet.v1.evt.>", "gpufleet.v1.evt.job.*")


INBOX = "_INBOX.UKEY"


@pytest.mark.parametrize(
    "subject",
    [
        "gpufleet.v1.rpc.scheduler.get_job.other",  # another account's request
        "gpufleet.v1.rpc.scheduler.get_job",  # no account
        "gpufleet.v1.cmd.node.m1.start_worker",
        "gpufleet.v1.evt.worker.finished.m1",
        "gpufleet.v1.evt.billing.usage_charged",
        "gpufleet.v1.evt.device.added",
        "gpufleet.v1.adm.provisioner.create_account",
        "gpufleet.v1.adm.provisioner.remove_account",
        "gpufleet.v1.adm.scheduler.list_all_jobs",  # every account's jobs
        "$JS.API.STREAM.PURGE.GPUFLEET_EVENTS",
        "$JS.API.CONSUMER.CREATE.GPUFLEET_LOGS",
        "gpufleet.v1.dlq.scheduler.other",
    ],
)
def test_a_user_may_not_publish(subject: str) -> None:
    assert not permissions.for_user("acme", INBOX).may_publish(subject)


@pytest.mark.parametrize(
    "subject",
    ["gpufleet.v1.evt.>", "gpufleet.v1.log.>", "gpufleet.v1.cmd.>", "_INBOX.>", ">"],
)
def test_a_user_may_not_subscribe(subject: str) -> None:
    assert not permissions.for_user("acme", INBOX).may_subscribe(subject)


def test_a_node_speaks_only_for_itself() -> None:
    node = permissions.for_node("m1", INBOX)
    assert node.may_publish("gpufleet.v1.evt.worker.finished.m1")
    assert node.may_publish("gpufleet.v1.log.m1.j1.0")
    assert node.may_publish("$JS.API.CONSUMER.MSG.NEXT.GPUFLEET_COMMANDS.node-m1")
    for subject in (
        "gpufleet.v1.evt.worker.finished.m2",
        "gpufleet.v1.cmd.provisioner.m2.register_node",
        "gpufleet.v1.log.m2.j1.0",
        "gpufleet.v1.hb.m2",
        "gpufleet.v1.cmd.node.m1.start_worker",
        "$JS.API.CONSUMER.MSG.NEXT.GPUFLEET_COMMANDS.node-m2",
        "$JS.API.CONSUMER.CREATE.GPUFLEET_COMMANDS",
        "$JS.API.CONSUMER.DURABLE.CREATE.GPUFLEET_COMMANDS.node-m1",
    ):
        assert not node.may_publish(subject), subject


def test_only_the_scheduler_commands_nodes_and_only_billing_bills() -> None:
    start = "gpufleet.v1.cmd.node.m1.start_worker"
    charge = "gpufleet.v1.evt.billing.usage_charged"
    for name in permissions.SERVICES:
        grant = permissions.for_service(name, INBOX)
        assert grant.may_publish(start) is (name == "scheduler"), name
        assert grant.may_publish(charge) is (name == "billing"), name
        assert not grant.may_publish("$JS.API.STREAM.PURGE.GPUFLEET_EVENTS"), name
        assert not grant.may_publish("$JS.API.STREAM.MSG.DELETE.GPUFLEET_EVENTS"), name


def test_permissions_markdown_lists_every_row() -> None:
    text = permissions.markdown()
    for row in permissions.table():
        assert f"## {row.kind}" in text
