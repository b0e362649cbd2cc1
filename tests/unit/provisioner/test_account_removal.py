"""R-TEN-1: when an account may be removed, judged from plain data."""

from __future__ import annotations

import pytest
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_provisioner.removal import Holdings, check_removal, removed

LIVE = {"_id": "acme", "plan": "team", "created_at_ms": 1}
TOMBSTONE = {**LIVE, "removed_at_ms": 2}


def test_an_account_holding_nothing_may_be_removed() -> None:
    check_removal("acme", LIVE, Holdings())


@pytest.mark.parametrize("doc", [None, TOMBSTONE])
def test_an_unknown_or_already_removed_account_is_not_found(doc: dict[str, object] | None) -> None:
    with pytest.raises(NotFound):
        check_removal("acme", doc, Holdings())


def test_an_account_with_nodes_is_refused_as_a_conflict_naming_them() -> None:
    with pytest.raises(Refused) as refused:
        check_removal("acme", LIVE, Holdings(nodes=("m-2", "m-1")))
    assert refused.value.code == "conflict"
    [field] = refused.value.fields
    assert (field.field, field.rule) == ("account", "R-TEN-1")
    assert "2 node(s): m-1, m-2" in field.message
    assert field.valid is not None and "node remove" in field.valid


def test_a_refusal_names_a_few_nodes_and_counts_the_rest() -> None:
    nodes = tuple(f"m-{i:02}" for i in range(8))
    with pytest.raises(Refused) as refused:
        check_removal("acme", LIVE, Holdings(nodes=nodes))
    assert refused.value.fields[0].message.endswith("m-04 and 3 more")


def test_a_tombstone_is_a_removed_account() -> None:
    assert removed(TOMBSTONE)
    assert not removed(LIVE)
    assert not removed(None)
    assert not removed({**LIVE, "removed_at_ms": None})
