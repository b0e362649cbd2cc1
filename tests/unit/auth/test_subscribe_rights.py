"""What a node and a user may subscribe to (the permission table's `sub` rows, as written into
their JWTs): a node, requests addressed to itself and its own inbox; a user, its own inbox.
Never another node's subjects, another identity's inbox, or a wildcard over them."""

from __future__ import annotations

import pytest
from gpufleet_auth import permissions
from gpufleet_auth.permissions import covered, overlaps
from gpufleet_contracts import subjects

pytestmark = pytest.mark.unit

INBOX = "_INBOX.UKEY1"
OTHER_INBOX = "_INBOX.UKEY2"
NODES = subjects.NODES  # gpufleet.v1.node


def test_a_node_subscribes_to_requests_addressed_to_itself_and_its_inbox() -> None:
    node = permissions.for_node("m1", INBOX)
    for subject in (f"{NODES}.m1.health", f"{NODES}.m1.*", f"{INBOX}.abc", f"{INBOX}.>"):
        assert node.may_subscribe(subject), subject


@pytest.mark.parametrize(
    "subject",
    [
        f"{NODES}.m2.health",  # another node's requests
        f"{NODES}.m2.*",
        f"{NODES}.*.health",  # every node's
        f"{NODES}.*.*",
        f"{NODES}.>",
        f"{NODES}.m1.health.x",
        f"{subjects.COMMANDS}.node.m1.start_worker",  # its commands: its consumer only
        f"{subjects.COMMANDS}.node.m2.*",
        f"{subjects.EVENTS}.>",
        f"{subjects.LOGS}.>",
        f"{subjects.HEARTBEATS}.*",
        f"{OTHER_INBOX}.>",  # another identity's replies
        "_INBOX.*.>",
        "_INBOX.>",
        ">",
    ],
)
def test_a_node_may_not_subscribe_to_others_subjects(subject: str) -> None:
    assert not permissions.for_node("m1", INBOX).may_subscribe(subject)


def test_a_nodes_jwt_allows_subscribing_to_its_own_subjects_only() -> None:
    claims = permissions.for_node("m1", INBOX).nats_claims()
    assert claims["sub"] == {"allow": [f"{NODES}.m1.*", f"{INBOX}.>"]}


def test_no_subscribe_right_of_one_node_reaches_another_nodes() -> None:
    """Whatever the ids: every pattern of m1's row stays clear of every pattern of m2's."""
    one = permissions.for_node("m1", INBOX).sub
    two = permissions.for_node("m2", OTHER_INBOX).sub
    assert not [(a, b) for a in one for b in two if overlaps(a, b)]
    for pattern in permissions.NODE.sub:
        assert "{minion_id}" in pattern or "{inbox}" in pattern, pattern


def test_a_user_subscribes_to_its_own_inbox_only() -> None:
    user = permissions.for_user("acme", INBOX)
    assert user.may_subscribe(f"{INBOX}.abc") and user.may_subscribe(f"{INBOX}.>")
    assert user.nats_claims()["sub"] == {"allow": [f"{INBOX}.>"]}
    for subject in (
        f"{OTHER_INBOX}.abc",
        f"{OTHER_INBOX}.>",
        "_INBOX.*.>",
        INBOX,  # the prefix itself is no reply subject
        f"{NODES}.m1.*",
        f"{subjects.RPC}.*.*.acme",  # its own requests, as the services receive them
    ):
        assert not user.may_subscribe(subject), subject
    assert not covered(f"{OTHER_INBOX}.x", permissions.for_user("acme", INBOX).sub)
