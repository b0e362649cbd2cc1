"""Who is speaking is read from the subject the server let through (gpufleet_bus.accounts)."""

from __future__ import annotations

import pytest
from gpufleet_bus import NoAccountError, account_of, node_of, on_its_own_subject


def test_the_acting_account_is_the_subjects_last_token() -> None:
    assert account_of("gpufleet.v1.rpc.scheduler.get_job.acme") == "acme"
    with pytest.raises(NoAccountError):
        account_of("gpufleet.v1.rpc.scheduler.get_job")


def test_a_worker_fact_counts_only_on_the_subject_of_the_node_its_body_names() -> None:
    subject = "gpufleet.v1.evt.worker.finished.evil"
    assert node_of(subject) == "evil"
    assert on_its_own_subject(subject, "evil")
    # `evil` may publish its own subject only; naming the victim's node in the body there
    # (to pass the check against the placement's node) is refused.
    assert not on_its_own_subject(subject, "local-node-1")


@pytest.mark.parametrize(
    ("subject", "reply", "answered"),
    [
        # an account's request: only that account's inboxes (its users', an operator's
        # acting for it), never another account's, a service's or a bare `_INBOX.<key>`
        ("gpufleet.v1.rpc.scheduler.get_job.acme", "_INBOX.account.acme.UKEY.n.1", True),
        ("gpufleet.v1.rpc.scheduler.get_job.acme", "_INBOX.account.globex.UKEY.n.1", False),
        ("gpufleet.v1.rpc.scheduler.get_job.acme", "_INBOX.account.acme", False),
        ("gpufleet.v1.rpc.scheduler.get_job.acme", "_INBOX.account.acmecorp.UKEY.1", False),
        ("gpufleet.v1.rpc.scheduler.get_job.acme", "_INBOX.UKEY.n.1", False),
        ("gpufleet.v1.rpc.scheduler.get_job.acme", "_INBOX.node.m1.UKEY.1", False),
        ("gpufleet.v1.rpc.scheduler.get_job.acme", "$JS.API.STREAM.PURGE.X", False),
        # an enrolment: only that minion id's join tokens'
        ("gpufleet.v1.enroll.m1", "_INBOX.enroll.m1.UKEY.n.1", True),
        ("gpufleet.v1.enroll.m1", "_INBOX.enroll.m2.UKEY.n.1", False),
        ("gpufleet.v1.enroll.m1", "_INBOX.account.m1.UKEY.n.1", False),
        # what only services and operators may publish: any inbox
        ("gpufleet.v1.adm.provisioner.create_account", "_INBOX.UKEY.n.1", True),
        ("gpufleet.v1.node.m1.health", "_INBOX.UKEY.n.1", True),
        ("gpufleet.v1.rpc.scheduler.get_job", "_INBOX.UKEY.n.1", True),  # no account
        ("gpufleet.v1.adm.provisioner.create_account", "gpufleet.v1.cmd.node.m1.x", False),
        # a node's own subjects, events: never answered
        ("gpufleet.v1.hb.m1", "_INBOX.node.m1.UKEY.1", False),
        ("gpufleet.v1.evt.worker.finished.m1", "_INBOX.UKEY.1", False),
    ],
)
def test_a_request_is_answered_only_in_the_inboxes_its_subject_proves(
    subject: str, reply: str, answered: bool
) -> None:
    """A requester chooses the reply subject: aimed at another identity's inbox, the answer
    would reach it (issue 26). The subject the server let through says whose inboxes count."""
    from gpufleet_bus.accounts import may_answer

    assert may_answer(subject, reply) is answered
