"""Base environments at the scheduler (R-JOB-7): a worker goes only to a node that offers
its environment (the reference scan and the index agree), and a submission whose
environment no node offers is refused naming the field."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from gpufleet_contracts.environments import BUILT_IN, EnvironmentOffer
from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.jobspec import BaseEnvironment
from gpufleet_scheduler import environments, jobrequest
from gpufleet_scheduler.fleet import node_doc, node_view
from gpufleet_scheduler.index import PlacementIndex
from gpufleet_scheduler.placement import (
    NoPlacement,
    Placement,
    no_environment,
    place,
    rule_out,
    why_not,
)

from .test_placement import node, random_fleet, random_request, req

pytestmark = pytest.mark.unit

PY310 = BaseEnvironment(python_version="3.10", framework="pytorch", framework_version="2.1")
DEFAULT = BaseEnvironment(python_version="3.11", framework="deep_learning")
MAPS_310 = EnvironmentOffer(
    python_versions=("3.11",),
    frameworks=("deep_learning", "pytorch", "tensorflow"),
    mapped=("py3.10-pytorch-2.1",),
)


def spec(**environment: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "j", "gpu_types": ["RTX 3090"], "command": ["true"], "environment": environment}
    )


def test_a_worker_goes_only_to_a_node_that_offers_its_environment() -> None:
    mapped = node("a", gpus=2)  # would lose to b on fit (more free GPUs)
    mapped = replace(mapped, environments=MAPS_310)
    plain = node("b", gpus=1)
    r = replace(req(), environment=PY310)
    got = place(r, [mapped, plain])
    assert isinstance(got, Placement) and got.node.node_id == "a"
    assert rule_out(r, plain) == no_environment(PY310)
    assert no_environment(PY310) == "does not offer the base environment py3.10-pytorch-2.1"
    # the default environment and a customer image (no base environment) go anywhere
    for environment in (DEFAULT, None):
        got = place(replace(req(), environment=environment), [mapped, plain])
        assert isinstance(got, Placement) and got.node.node_id == "b"
    busy = replace(mapped, free_indices=())
    waiting = why_not(r, [busy, plain])
    assert waiting.reasons == {
        "busy (0 of 2 GPUs free, needs 1)": 1,
        "does not offer the base environment py3.10-pytorch-2.1": 1,
    }
    assert PlacementIndex([busy, plain]).explain(r).reasons == waiting.reasons


ENVS = (
    None,
    DEFAULT,
    DEFAULT,
    BaseEnvironment(python_version="3.11", framework="pytorch", framework_version="2.3"),
    PY310,
    BaseEnvironment(python_version="3.8", framework="mxnet", framework_version="1.9"),
)
OFFERS = (
    BUILT_IN,
    BUILT_IN,
    MAPS_310,
    EnvironmentOffer(mapped=("py3.8-mxnet-1.9", "py3.10-pytorch-2.1")),  # maps only
)


def test_the_index_agrees_with_the_linear_scan_on_environments() -> None:
    """Random fleets whose nodes offer different environments, requests for them; the
    index keeps one memo of failed searches a pass (as queue.py does), so a search that
    found no node for one environment must not stand for another's."""
    rng = random.Random(27)
    refused = placed_mapped = 0
    for _ in range(40):
        fleet = [replace(n, environments=rng.choice(OFFERS)) for n in random_fleet(rng, 40)]
        index = PlacementIndex(fleet)
        holds = {n.node_id: "j-old" for n in rng.sample(fleet, min(3, len(fleet)))}
        memo: dict[tuple[object, ...], int] = {}
        for i in range(40):
            r = replace(random_request(rng, i), environment=rng.choice(ENVS))
            expected = place(r, list(index.nodes.values()), holds)
            got = index.place(r, holds, memo)
            if isinstance(expected, NoPlacement):
                assert got is None
                reasons = why_not(r, list(index.nodes.values()), holds).reasons
                assert index.explain(r, holds).reasons == reasons
                refused += r.environment is not None and reasons[no_environment(r.environment)] > 0
            else:
                assert got == expected
                assert r.environment is None or expected.node.environments.offers(r.environment)
                placed_mapped += r.environment in (PY310, ENVS[-1])
                index.take(got)
    assert refused > 20 and placed_mapped > 20


def test_the_node_document_keeps_what_its_agent_announced() -> None:
    doc = node_doc(replace(node("a"), environments=MAPS_310))
    assert doc["environments"]["mapped"] == ["py3.10-pytorch-2.1"]
    assert node_view(doc).environments == MAPS_310
    older = {k: v for k, v in doc.items() if k != "environments"}  # before it was kept
    assert node_view(older).environments == BUILT_IN
    assert node_view({**doc, "environments": None}).environments == BUILT_IN
    # one offer object for the many nodes that announce the same
    assert node_view(doc).environments is node_view(dict(doc)).environments


def test_a_jobs_request_keeps_its_environment() -> None:
    s = spec(python_version="3.10", framework="pytorch", framework_version="2.1")
    stored = jobrequest.encode(s, "default", None)
    assert stored["req"]["environment"] == {
        "python_version": "3.10",
        "framework": "pytorch",
        "framework_version": "2.1",
    }
    job = {"_id": "j1", **stored}
    assert jobrequest.decode(job).environment == PY310
    assert jobrequest.decode({**job, "spec": {}}).environment == PY310  # req, not the spec
    image = jobrequest.encode(spec(image="reg.example/me/img:1"), "default", None)
    assert image["req"]["environment"] is None  # a customer image: any node
    assert jobrequest.decode({"_id": "j2", **image}).environment is None
    # stored before `req` kept it: from the spec; a checkpoint's copy (no spec): any node
    old_req = {k: v for k, v in stored["req"].items() if k != "environment"}
    assert jobrequest.decode({**job, "req": old_req}).environment == PY310
    assert jobrequest.decode({"_id": "j1", "req": old_req}).environment is None
    assert jobrequest.decode({"_id": "j3", **jobrequest.encode(spec(), "d", None)}).environment == (
        DEFAULT
    )


def test_a_submission_no_node_offers_is_refused_naming_its_field() -> None:
    py38 = spec(python_version="3.8").environment.base()
    assert py38 is not None
    no_nodes = environments.fleet_offers([])
    assert no_nodes == [BUILT_IN]  # judged by what every gpufleet node builds
    assert environments.refusal(DEFAULT, no_nodes, None) is None
    refused = environments.refusal(py38, no_nodes, None)
    assert refused is not None and refused.code == "invalid"
    (field,) = refused.fields
    assert (field.field, field.rule) == ("spec.environment.python_version", "R-JOB-7")
    assert field.message == "no node offers a base environment for Python 3.8"
    assert field.valid is not None and field.valid.startswith("Python 3.11 with deep_learning")
    # a node whose agent announced nothing counts as BUILT_IN; a mapped one adds its tags
    fleet = environments.fleet_offers([None, MAPS_310.model_dump(mode="json")])
    assert environments.refusal(PY310, fleet, None) is None
    mx = spec(framework="mxnet").environment.base()
    assert mx is not None
    refused = environments.refusal(mx, fleet, "eu")
    assert refused is not None
    assert refused.fields[0].field == "spec.environment.framework"
    assert refused.fields[0].message == (
        "no node in region eu offers a base environment for mxnet with Python 3.11"
    )
    assert refused.fields[0].valid is not None and "mapped: py3.10-pytorch-2.1" in (
        refused.fields[0].valid
    )
    latest = BaseEnvironment(python_version="3.10", framework="pytorch")
    refused = environments.refusal(latest, fleet, None)
    assert refused is not None and refused.fields[0].field == "spec.environment.framework_version"


def test_the_nodes_filters_say_what_an_offer_says() -> None:
    """`offering` (the queries admission asks first) against `offer_of(...).offers`: a
    document matches one of them exactly when its offer has the triple (each filter
    evaluated here as the store would; the integration test asks the store itself)."""

    def matches(doc: dict[str, object], clause: dict[str, object]) -> bool:
        env = doc.get("environments")
        for key, want in clause.items():
            if key == "environments":
                assert want is None
                if env is not None:
                    return False
                continue
            assert isinstance(env, dict) or env is None
            have = (env or {}).get(key.split(".", 1)[1]) or []
            if want not in have:
                return False
        return True

    docs = [
        {"environments": None},
        {"environments": BUILT_IN.model_dump(mode="json")},
        {"environments": MAPS_310.model_dump(mode="json")},
        {"environments": OFFERS[-1].model_dump(mode="json")},
        {"environments": {"python_versions": ["3.12"], "frameworks": ["pytorch"], "mapped": []}},
    ]
    for base in [e for e in ENVS if e is not None] + [
        BaseEnvironment(python_version="3.12", framework="pytorch"),
        BaseEnvironment(python_version="3.11", framework="deep_learning", framework_version="1"),
        BaseEnvironment(python_version="3.11", framework="pytorch", framework_version="latest"),
    ]:
        query = environments.offering(base)
        for doc in docs:
            stored = doc["environments"]
            assert isinstance(stored, dict) or stored is None
            expected = environments.offer_of(stored).offers(base)
            assert any(matches(doc, c) for c in query) == expected, (base, doc)


def test_the_scheduler_default_is_unchanged_for_a_fleet_of_older_agents() -> None:
    """Nodes registered before agents announced anything run what they always ran."""
    old = node_view({k: v for k, v in node_doc(node("a")).items() if k != "environments"})
    assert place(replace(req(), environment=DEFAULT), [old]) is not None
    assert isinstance(place(replace(req(), environment=PY310), [old]), NoPlacement)
