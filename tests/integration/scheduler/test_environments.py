"""Base environments (R-JOB-7) through the running scheduler, on the real bus and database:
a job whose environment no node offers is refused at submission naming the field, and a job
whose environment only a node's operator maps runs there and nowhere else."""

from __future__ import annotations

from typing import Any

from gpufleet_contracts.environments import EnvironmentOffer
from gpufleet_contracts.jobspec import BaseEnvironment
from gpufleet_contracts.nodes import NodeRegistered
from gpufleet_scheduler import environments

from .test_fleet import Sys, known, registered, system

__all__ = ["system"]  # the fixture, shared with test_fleet.py

PY310 = {"python_version": "3.10", "framework": "pytorch", "framework_version": "2.1"}


def mapping(evt: NodeRegistered, *tags: str) -> NodeRegistered:
    """`evt` of a node whose operator maps `tags` (GPUFLEET_BASE_ENVIRONMENTS)."""
    offer = EnvironmentOffer(
        python_versions=("3.11",),
        frameworks=("deep_learning", "pytorch", "tensorflow"),
        mapped=tags,
    )
    return evt.model_copy(update={"environments": offer})


def refused_field(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply["ok"] is False, reply
    assert reply["error"]["code"] == "invalid"
    (field,) = reply["error"]["fields"]
    assert field["rule"] == "R-JOB-7"
    return dict(field)


async def test_an_environment_no_node_offers_is_refused_at_submission(system: Sys) -> None:
    s = system
    # No node yet: judged by what every gpufleet node builds (Python 3.11), so a first job
    # is queued and one asking for Python 3.8 is refused.
    first = await s.submit("first")
    assert first["state"] == "queued"
    field = refused_field(await s.submit("py38", environment={"python_version": "3.8"}))
    assert field["field"] == "spec.environment.python_version"
    assert field["message"] == "no node offers a base environment for Python 3.8"
    assert field["valid"].startswith("Python 3.11 with deep_learning (no version), pytorch")

    await s.node(registered("plain", region="us"))  # its agent announced nothing: Python 3.11
    await s.node(mapping(registered("mapped", region="eu"), "py3.10-pytorch-2.1"))
    await known(s, "plain", "mapped")
    # the store answers admission's first query as the offers do (environments.offering)
    nodes = s.sched.state.db.nodes
    for triple, offered in (
        (PY310, ["mapped"]),
        ({"python_version": "3.11", "framework": "deep_learning"}, ["mapped", "plain"]),
        (
            {"python_version": "3.11", "framework": "pytorch", "framework_version": "2.3"},
            ["mapped", "plain"],
        ),
        ({"python_version": "3.8", "framework": "deep_learning"}, []),
    ):
        found = set()
        for query in environments.offering(BaseEnvironment.model_validate(triple)):
            found |= {n["minion_id"] async for n in nodes.find(query)}
        assert sorted(found) == offered, triple
    field = refused_field(await s.submit("py38", environment={"python_version": "3.8"}))
    assert field["field"] == "spec.environment.python_version"
    assert "mapped: py3.10-pytorch-2.1" in field["valid"]
    field = refused_field(await s.submit("mx", environment={"framework": "mxnet"}))
    assert field["field"] == "spec.environment.framework"
    latest = {"python_version": "3.10", "framework": "pytorch"}  # py3.10-pytorch-latest
    field = refused_field(await s.submit("latest", environment=latest))
    assert field["field"] == "spec.environment.framework_version"
    # pinned to a region (R-RES-1): only its nodes count
    field = refused_field(await s.submit("pinned-us", region="us", environment=PY310))
    assert field["field"] == "spec.environment.python_version"
    assert field["message"] == "no node in region us offers a base environment for Python 3.10"
    assert (await s.submit("pinned-eu", region="eu", environment=PY310))["state"] == "starting"
    # a customer image needs no base environment
    image = {"python_version": "3.8", "image": "registry.example/me/py38:1"}
    assert (await s.submit("image", environment=image))["state"] == "starting"
    stored = await s.sched.state.db.jobs.count_documents({"name": {"$in": ["py38", "mx"]}})
    assert stored == 0  # a refused job is not stored


async def test_a_mapped_environment_runs_only_on_the_node_that_maps_it(system: Sys) -> None:
    s = system
    # b would win without the rule: the same rate, and the tightest fit (one GPU, all free)
    await s.node(mapping(registered("a", gpus=2), "py3.10-pytorch-2.1"))
    await s.node(registered("b", gpus=1))
    await known(s, "a", "b")

    job = await s.submit("torch", environment=PY310)
    assert job["state"] == "starting" and job["workers"][0]["node"] == "a"
    (start,) = await s.starts("a")
    assert start.base_environment is not None
    assert start.base_environment.model_dump(mode="json") == PY310

    # a's other GPU is taken by a second one; a third waits, and says why b will not do
    assert (await s.submit("torch-2", environment=PY310))["workers"][0]["node"] == "a"
    waits = await s.submit("torch-3", environment=PY310)
    assert waits["state"] == "queued"
    assert waits["queue_reason"] == (
        "1 node: busy (0 of 2 GPUs free, needs 1); "
        "1 node: does not offer the base environment py3.10-pytorch-2.1"
    )
    # the default environment still runs on b
    plain = await s.submit("plain")
    assert plain["state"] == "starting" and plain["workers"][0]["node"] == "b"
    assert await s.starts("b")
