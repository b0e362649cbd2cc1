"""The client finds every request's subject from its model alone: walked over every request,
operator's request and direct subject in every service's wiring table, as `just docs` builds
them, the subject a model resolves to is one its route serves."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_client import Unauthenticated, addressed, base_subject, repeatable, subject_of
from gpufleet_contracts import subjects
from gpufleet_contracts.base import Command
from gpufleet_contracts.jobs import GetJob, SubmitJob
from gpufleet_devstack import docs

SERVICES = list(docs._services())
ACCOUNT, NODE = "acme", "m-1"


def _routes() -> list[Any]:
    return [r for build in docs._services().values() for r in build().runtime.requests.routes]


ROUTES = _routes()


def matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: `*` one token, `>` the rest."""
    tokens, wanted = subject.split("."), pattern.split(".")
    for i, want in enumerate(wanted):
        if want == ">":
            return len(tokens) > i
        if i >= len(tokens) or (want != "*" and want != tokens[i]):
            return False
    return len(tokens) == len(wanted)


def example(model: type[Command]) -> Command:
    """An instance of `model` whose subject keys are filled (not validated: only its subject
    is read)."""
    construct: Any = model.model_construct
    request: Command = construct(**dict.fromkeys(model.subject_keys(), NODE))
    return request


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.subject)
def test_each_wired_request_resolves_to_the_subject_its_service_serves(route: Any) -> None:
    request = example(route.model)
    if not route.model.SUBJECT:
        # several services answer it (health, dead letters): the asker names which
        with pytest.raises(TypeError, match="pass subject="):
            base_subject(request)
        base = route.subject.removesuffix(".*") if route.by_account else route.subject
        assert matches(subject_of(request, ACCOUNT, base), route.subject)
        return
    sent = subject_of(request, ACCOUNT, node=NODE)
    assert matches(sent, route.subject), (sent, route.subject)
    if route.by_account:
        assert sent == subjects.as_account(route.model.SUBJECT, ACCOUNT)


def test_the_walk_sees_every_kind_of_subject() -> None:
    prefixes = {r.subject.split(".")[2] for r in ROUTES}
    assert {"rpc", "adm", "enroll", "nrpc", "svc", "node"} <= prefixes
    assert len(ROUTES) > 40


def test_an_account_request_needs_an_account_and_others_do_not() -> None:
    with pytest.raises(Unauthenticated) as no_account:
        subject_of(GetJob(job_id="j-1"), None)
    assert no_account.value.code == "unauthenticated"
    assert addressed(subjects.admin("provisioner", "list_accounts"), None) == (
        "gpufleet.v1.adm.provisioner.list_accounts"
    )
    with pytest.raises(Unauthenticated):
        addressed(subjects.node_request("scheduler", "stage_local_data"), ACCOUNT)


def test_reads_and_requests_with_their_id_are_repeatable() -> None:
    assert repeatable(GetJob(job_id="j-1"))
    submit: Any = SubmitJob.model_construct
    assert repeatable(submit(request_id="r-1"))
    assert not repeatable(submit(request_id=None))
    reads = {r.model.__name__ for r in ROUTES if r.model.READ}
    assert {"GetJob", "ListJobs", "ListNodes", "GetBalance", "HealthCheck"} <= reads
    assert not {"SubmitJob", "CancelJob", "AddNode", "RemoveNode"} & reads
