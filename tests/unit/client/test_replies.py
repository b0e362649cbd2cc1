"""How an answer becomes a result: the request's reply model, or the error it says."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from gpufleet_client import (
    BadReply,
    Client,
    ClientError,
    Disconnected,
    Forbidden,
    ServiceError,
    Unauthenticated,
    Unavailable,
    decode,
    parse,
)
from gpufleet_contracts import FieldError
from gpufleet_contracts.jobs import GetJob, ListJobs
from gpufleet_contracts.jobviews import JobView

SUBJECT = GetJob.SUBJECT
REFUSAL = {
    "ok": False,
    "error": {
        "code": "invalid",
        "message": "the request does not validate",
        "fields": [{"field": "job_id", "rule": "R-TEN-2", "message": "bad", "valid": "a-z"}],
    },
    "type": "gpufleet.error.v1",
}


def test_a_refusal_is_a_service_error_with_its_fields_and_the_reply_as_sent() -> None:
    with pytest.raises(ServiceError) as refused:
        decode(JobView, SUBJECT, json.dumps(REFUSAL).encode())
    err = refused.value
    assert (err.code, err.message, err.subject) == (
        "invalid",
        "the request does not validate",
        SUBJECT,
    )
    assert err.fields == [FieldError(field="job_id", rule="R-TEN-2", message="bad", valid="a-z")]
    assert err.raw == REFUSAL


def test_a_malformed_refusal_still_says_it_was_refused() -> None:
    with pytest.raises(ServiceError) as refused:
        parse(SUBJECT, b'{"ok": false, "error": "nope"}')
    assert refused.value.code == "internal" and refused.value.fields == []


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "JSON list"),
        (b'{"id": 1}', "not a JobView"),
    ],
)
def test_an_answer_that_is_not_the_reply_model_is_a_bad_reply(data: bytes, why: str) -> None:
    with pytest.raises(BadReply, match=why) as bad:
        decode(JobView, SUBJECT, data)
    assert bad.value.code == "internal"


def test_a_reply_is_validated_into_the_requests_reply_model() -> None:
    raw = {
        "id": "j-1",
        "name": "n",
        "project": "default",
        "owner": "acme",
        "creator": "u",
        "state": "queued",
        "spec": {},
        "history": [],
        "notes": [],
        "workers": [],
    }
    assert GetJob.REPLY is JobView
    view = decode(JobView, SUBJECT, json.dumps(raw).encode())
    assert isinstance(view, JobView) and (view.id, view.state) == ("j-1", "queued")


async def test_ask_refuses_a_reply_type_that_does_not_answer_the_request() -> None:
    client = Client(cast(Any, None))  # never reaches the connection
    with pytest.raises(TypeError, match="answered by JobList"):
        await client.ask(ListJobs(), JobView)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (Unavailable, "unavailable"),
        (Disconnected, "unavailable"),
        (Forbidden, "forbidden"),
        (Unauthenticated, "unauthenticated"),
        (BadReply, "internal"),
    ],
)
def test_each_failure_says_its_code_and_subject(error: type[ClientError], code: str) -> None:
    failure = error("why", "gpufleet.v1.rpc.scheduler.get_job.acme")
    assert isinstance(failure, ClientError)
    assert (failure.code, failure.message, failure.subject) == (
        code,
        "why",
        "gpufleet.v1.rpc.scheduler.get_job.acme",
    )
