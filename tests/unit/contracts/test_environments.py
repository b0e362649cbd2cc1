"""Base environments as data (R-JOB-7): tags, what a node offers, and how a fleet's offers
name what is missing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from gpufleet_contracts import limits
from gpufleet_contracts.environments import (
    BUILT_IN,
    EnvironmentOffer,
    describe,
    distinct,
    env_tag,
    tag_of,
    unoffered_field,
)
from gpufleet_contracts.jobspec import BaseEnvironment, Environment
from gpufleet_contracts.nodes import NodeRegistered, NodeState, RegisterNode
from pydantic import ValidationError

pytestmark = pytest.mark.unit

MAPPED = EnvironmentOffer(
    python_versions=("3.11",),
    frameworks=("deep_learning", "pytorch", "tensorflow"),
    mapped=("py3.10-pytorch-2.1", "py3.8-mxnet-1.9", "py3.12-deep_learning"),
)


def base(**kw: object) -> BaseEnvironment:
    found = Environment.model_validate(kw).base()
    assert found is not None
    return found


def test_a_tag_names_the_triple() -> None:
    assert env_tag("3.11", "pytorch", "2.3") == "py3.11-pytorch-2.3"
    assert env_tag("3.11", "pytorch", "2.*") == "py3.11-pytorch-2.x"
    assert env_tag("3.11", "tensorflow", None) == "py3.11-tensorflow-latest"
    assert env_tag("3.11", "deep_learning", None) == "py3.11-deep_learning"
    assert tag_of(base(python_version="3.10", framework="pytorch", framework_version="2.1")) == (
        "py3.10-pytorch-2.1"
    )


def test_every_node_builds_python_3_11_with_the_frameworks_that_have_wheels() -> None:
    assert BUILT_IN.offers(base())  # the contract's default environment
    assert BUILT_IN.offers(base(framework="pytorch"))
    assert BUILT_IN.offers(base(framework="tensorflow", framework_version="2.*"))
    for refused in (
        base(python_version="3.8"),
        base(python_version="3.10", framework="pytorch"),
        base(python_version="3.12"),
        base(framework="mxnet"),
        base(framework="deep_learning", framework_version="1"),  # nothing to version
        base(framework="pytorch", framework_version="latest"),  # not a version
    ):
        assert not BUILT_IN.offers(refused), refused


def test_an_operators_map_offers_exactly_its_tags() -> None:
    assert MAPPED.offers(base(python_version="3.10", framework="pytorch", framework_version="2.1"))
    assert MAPPED.offers(base(python_version="3.8", framework="mxnet", framework_version="1.9"))
    assert MAPPED.offers(base(python_version="3.12"))
    assert not MAPPED.offers(base(python_version="3.10", framework="pytorch"))  # -latest
    assert not MAPPED.offers(
        base(python_version="3.10", framework="pytorch", framework_version="2.2")
    )
    assert not MAPPED.offers(base(python_version="3.9"))


def test_the_field_a_refusal_names_is_the_part_no_offer_has() -> None:
    offers = [BUILT_IN, MAPPED]
    assert unoffered_field(offers, base(python_version="3.9")) == "python_version"
    assert unoffered_field(offers, base(python_version="3.10")) == "framework"
    assert unoffered_field(offers, base(framework="mxnet")) == "framework"
    assert (
        unoffered_field(offers, base(python_version="3.10", framework="pytorch"))
        == "framework_version"
    )
    assert unoffered_field(offers, base(framework_version="1")) == "framework_version"


def test_what_offers_give_together_is_described_for_the_refusal() -> None:
    text = describe(distinct([BUILT_IN, MAPPED, BUILT_IN]))
    assert text == (
        "Python 3.11 with deep_learning (no version), pytorch or tensorflow (a version or "
        "none); mapped: py3.10-pytorch-2.1, py3.12-deep_learning, py3.8-mxnet-1.9; "
        "or a customer image (environment.image)"
    )
    many = EnvironmentOffer(mapped=tuple(f"py3.10-pytorch-2.{i}" for i in range(30)))
    assert describe([many]).endswith("and 6 more; or a customer image (environment.image)")
    assert len(distinct([BUILT_IN, MAPPED, BUILT_IN.model_copy()])) == 2


def test_a_node_announces_its_offer_and_the_provisioner_carries_it() -> None:
    reg = RegisterNode(
        minion_id="m1",
        name="m1",
        region="local",
        owner="acme",
        hostname="h",
        gpus=[],
        simulated=True,
        inventory_source="test",
        agent_started_at=datetime.now(UTC),
        environments=MAPPED,
    )
    assert RegisterNode.from_bytes(reg.to_bytes()).environments == MAPPED
    older = RegisterNode.model_validate({**reg.model_dump(mode="json"), "environments": None})
    assert older.environments is None  # an agent older than the announcement
    evt = NodeRegistered(
        node_id="n-m1",
        minion_id="m1",
        name="m1",
        region="local",
        owner="acme",
        state=NodeState.active,
        gpus=[],
        simulated=True,
        at=datetime.now(UTC),
        environments=reg.environments,
    )
    assert NodeRegistered.from_bytes(evt.to_bytes()).environments == MAPPED


def test_an_offer_is_bounded_and_its_tags_are_tags() -> None:
    too_many = tuple(f"py3.10-pytorch-2.{i}" for i in range(limits.NODE_ENVIRONMENTS + 1))
    with pytest.raises(ValidationError):
        EnvironmentOffer(mapped=too_many)
    for bad in ("torch", "py3.10 pytorch", "py3.10-pytorch-2.1;rm", "py3.10-" + "x" * 200):
        with pytest.raises(ValidationError):
            EnvironmentOffer(mapped=(bad,))
    with pytest.raises(ValidationError):
        EnvironmentOffer(python_versions=("three",))
