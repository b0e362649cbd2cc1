"""The pure parts of the dead-letter path: envelope rules, the account of a record, errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from gpufleet_bus.deadletter import (
    EnvelopeError,
    MissingHeaders,
    UnknownMessageType,
    check_envelope,
    dead_letter_account,
    dead_letter_subject,
    envelope_decoder,
    not_json,
)
from gpufleet_contracts import Envelope
from gpufleet_contracts.deadletters import ListDeadLetters
from gpufleet_contracts.jobs import EnqueueJob, StartWorker, StopWorker
from pydantic import ValidationError

TYPES = [StartWorker.TYPE, StopWorker.TYPE]


def headers(type_: str = StartWorker.TYPE, **over: Any) -> dict[str, Any]:
    h: dict[str, Any] = Envelope(type=type_, source="gpufleet/scheduler", subject="s").headers()
    h.update(over)
    return {k: v for k, v in h.items() if v is not None}


def test_a_command_with_its_envelope_passes() -> None:
    check_envelope(headers(), TYPES)
    check_envelope(headers(StopWorker.TYPE), TYPES)


def test_a_command_of_another_type_is_refused() -> None:
    with pytest.raises(UnknownMessageType) as caught:
        check_envelope(headers(EnqueueJob.TYPE), TYPES)
    assert caught.value.errors() == [
        {
            "field": "ce-type",
            "rule": "header:type",
            "message": f"'{EnqueueJob.TYPE}' is not one of {', '.join(sorted(TYPES))}",
        }
    ]


@pytest.mark.parametrize("missing", ["ce-type", "ce-id", "ce-source", "ce-specversion"])
def test_a_command_without_a_required_header_is_refused(missing: str) -> None:
    with pytest.raises(MissingHeaders) as caught:
        check_envelope(headers(**{missing: None}), TYPES)
    assert caught.value.missing == [missing]
    with pytest.raises(MissingHeaders):
        check_envelope(headers(**{missing: " "}), TYPES)


def test_no_headers_at_all_names_every_missing_one() -> None:
    with pytest.raises(MissingHeaders) as caught:
        check_envelope(None, TYPES)
    assert [e["field"] for e in caught.value.errors()] == [
        "ce-specversion",
        "ce-id",
        "ce-source",
        "ce-type",
    ]


def test_another_cloudevents_version_is_refused() -> None:
    with pytest.raises(EnvelopeError) as caught:
        check_envelope(headers(**{"ce-specversion": "0.3"}), TYPES)
    assert caught.value.errors()[0]["rule"] == "header:specversion"


def test_the_envelope_decoder_checks_before_decoding() -> None:
    decoded: list[Any] = []

    class Msg:
        def __init__(self, h: dict[str, Any]) -> None:
            self.headers = h

    async def original(msg: Any) -> Any:
        decoded.append(msg)
        return {"ok": 1}

    decode = envelope_decoder(TYPES)
    good: Any = Msg(headers())
    other: Any = Msg(headers("gpufleet.other.v1"))
    assert asyncio.run(decode(good, original)) == {"ok": 1}
    with pytest.raises(UnknownMessageType):
        asyncio.run(decode(other, original))
    assert len(decoded) == 1


@pytest.mark.parametrize(
    ("subject", "account"),
    [
        ("gpufleet.v1.rpc.provisioner.enable_provider.acme", "acme"),
        ("gpufleet.v1.rpc.scheduler.submit_job.a-b_1", "a-b_1"),
        (EnqueueJob.subject_for("acme"), "acme"),
        ("gpufleet.v1.cmd.scheduler.acme.other_verb", None),
        ("gpufleet.v1.cmd.node.m1.start_worker", None),
        ("gpufleet.v1.evt.worker.finished.m1", None),
        ("gpufleet.v1.adm.billing.payouts", None),
        ("gpufleet.v1.rpc.svc.verb", None),
        (None, None),
        ("", None),
    ],
)
def test_the_account_of_a_dead_letter_comes_from_its_subject(
    subject: str | None, account: str | None
) -> None:
    assert dead_letter_account(subject) == account


def test_dead_letter_subjects_per_account() -> None:
    assert (
        dead_letter_subject("provisioner", "gpufleet.v1.rpc.provisioner.x.acme")
        == "gpufleet.v1.dlq.provisioner.acme"
    )
    assert dead_letter_subject("node-m1", "gpufleet.v1.cmd.node.m1.start_worker") == (
        "gpufleet.v1.dlq.node-m1._"
    )


def test_not_json_is_worded_as_pydantic_words_it() -> None:
    for raw in (b"{bad", b"\xff not json"):
        try:
            json.loads(raw)
        except ValueError as exc:
            (error,) = not_json(exc)
        assert error.field == "(message)" and error.rule == "schema:json_invalid"
        assert error.message.startswith("Invalid JSON: ")


def test_list_dead_letters_limit() -> None:
    assert ListDeadLetters().limit == 50
    assert ListDeadLetters.from_bytes(b'{"limit": 1000}').limit == 1000
    for bad in (0, 1001):
        with pytest.raises(ValidationError):
            ListDeadLetters(limit=bad)


def test_each_identity_may_do_what_its_dead_letter_path_does() -> None:
    """The permission table allows the dead-letter path and its reading, nothing more."""
    from gpufleet_auth import permissions
    from gpufleet_bus import account_subject
    from gpufleet_contracts import subjects
    from gpufleet_node_agent.app import dead_letter_service

    node = permissions.for_node("m1", "_INBOX.N")
    assert node.may_publish(subjects.dead_letter(dead_letter_service("m1")))
    assert not node.may_publish(subjects.dead_letter("node-agent"))
    assert not node.may_publish(subjects.dead_letter(dead_letter_service("m2")))
    dlq = subjects.STREAM_DLQ
    for name in permissions.SERVICES:
        grant = permissions.for_service(name, "_INBOX.S")
        assert grant.may_publish(subjects.dead_letter(name, "acme"))
        assert grant.may_subscribe(account_subject(name, "dead_letters"))
        assert grant.may_subscribe(subjects.admin(name, "dead_letters"))
        for api in (
            f"CONSUMER.CREATE.{dlq}",
            f"CONSUMER.DELETE.{dlq}.c",
            f"CONSUMER.MSG.NEXT.{dlq}.c",
        ):
            assert grant.may_publish(f"$JS.API.{api}"), (name, api)
    user = permissions.for_user("acme", "_INBOX.U")
    assert user.may_publish(subjects.as_account(subjects.rpc("billing", "dead_letters"), "acme"))
    assert not user.may_publish(subjects.as_account(subjects.rpc("billing", "dead_letters"), "b"))
    assert not user.may_publish(subjects.admin("billing", "dead_letters"))
    assert not user.may_publish(f"$JS.API.CONSUMER.CREATE.{dlq}")


@pytest.mark.parametrize(
    ("destination", "sent"),
    [
        ("_INBOX.UKEY.abc.1", True),
        ("$JS.API.STREAM.PURGE.GPUFLEET_EVENTS", False),
        ("$JS.API.CONSUMER.DELETE.GPUFLEET_EVENTS.billing-worker-events", False),
        ("gpufleet.v1.cmd.node.m1.start_worker", False),
    ],
)
def test_a_reply_goes_to_an_inbox_only(destination: str, sent: bool) -> None:
    """A requester chooses the reply subject: one that is not an inbox would have the
    service's credential make a call for it (C1 of the review), so it is never answered."""
    from faststream.response.publish_type import PublishType
    from gpufleet_bus.deadletter import dead_letter_middleware

    published: list[str] = []

    class Cmd:
        publish_type = PublishType.REPLY

        def __init__(self, destination: str) -> None:
            self.destination = destination

    async def call_next(cmd: Any) -> None:
        published.append(cmd.destination)

    middleware = dead_letter_middleware("svc")(None, context=None)
    asyncio.run(middleware.publish_scope(call_next, Cmd(destination)))
    assert published == ([destination] if sent else [])


@pytest.mark.parametrize(
    ("destination", "sent"),
    [
        ("_INBOX.account.acme.UKEY.abc.1", True),
        ("_INBOX.account.globex.UKEY.abc.1", False),
        ("_INBOX.UKEY.abc.1", False),
    ],
)
def test_a_reply_goes_only_to_the_inboxes_of_the_account_that_asked(
    destination: str, sent: bool
) -> None:
    """A FastStream reply to an account's request (`...get_job.acme`) goes only to that
    account's inboxes: another identity's would receive an answer it never asked for."""
    from faststream.response.publish_type import PublishType
    from gpufleet_bus.deadletter import dead_letter_middleware

    published: list[str] = []

    class Asked:
        subject = "gpufleet.v1.rpc.scheduler.get_job.acme"

    class Cmd:
        publish_type = PublishType.REPLY

        def __init__(self, destination: str) -> None:
            self.destination = destination

    async def call_next(cmd: Any) -> None:
        published.append(cmd.destination)

    middleware = dead_letter_middleware("svc")(Asked(), context=None)
    asyncio.run(middleware.publish_scope(call_next, Cmd(destination)))
    assert published == ([destination] if sent else [])
