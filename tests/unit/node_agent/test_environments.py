"""Base environments (R-JOB-7): which triples this node builds, maps or refuses, and what its
registration announces of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts import limits
from gpufleet_contracts.environments import BUILT_IN, EnvironmentOffer
from gpufleet_contracts.jobspec import BaseEnvironment, Environment
from gpufleet_contracts.serving import NOTEBOOK_COMMAND, Serving
from gpufleet_node_agent.environments import (
    choose,
    env_tag,
    offer,
    parse_env_map,
    with_jupyter,
    with_pip,
)
from gpufleet_node_agent.prepare import needs_preparing, prepare_image
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

pytestmark = pytest.mark.unit

BASE = "gpufleet/base:bookworm"


def env(**kw: object) -> dict[str, object]:
    base = Environment(**kw).base()  # type: ignore[arg-type]
    assert base is not None
    return base.model_dump(mode="json")


def test_tags_name_the_triple() -> None:
    assert env_tag("3.11", "pytorch", "2.3") == "py3.11-pytorch-2.3"
    assert env_tag("3.11", "pytorch", "2.*") == "py3.11-pytorch-2.x"
    assert env_tag("3.11", "tensorflow", None) == "py3.11-tensorflow-latest"
    assert env_tag("3.11", "deep_learning", None) == "py3.11-deep_learning"


def test_the_default_environment_is_the_base_image_with_nothing_to_build() -> None:
    choice = choose(env(), BASE, {})
    assert (choice.image, choice.steps, choice.refused) == (BASE, (), None)
    assert choose(None, BASE, {}).image == BASE  # an older scheduler's StartWorker


def test_a_framework_is_built_once_from_the_base_image_with_its_wheels() -> None:
    choice = choose(env(framework="pytorch", framework_version="2.3"), BASE, {})
    assert choice.image == "localhost/gpufleet/env:py3.11-pytorch-2.3"
    assert choice.from_image == BASE
    assert [(s.kind, s.items, s.binary_only) for s in choice.steps] == [
        ("apt", ("python3-pip",), False),
        ("pip", ("torch==2.3",), True),
    ]
    latest = choose(env(framework="tensorflow"), BASE, {})
    assert latest.image.endswith(":py3.11-tensorflow-latest")
    assert latest.steps[1].items == ("tensorflow",)


def test_what_the_node_cannot_build_is_refused_naming_the_field() -> None:
    py310 = choose(env(python_version="3.10"), BASE, {}).refused
    assert py310 is not None and py310.startswith("environment.python_version 3.10: ")
    assert "Python 3.11 only" in py310
    mx = choose(env(framework="mxnet", framework_version="1.9"), BASE, {}).refused
    assert mx is not None and mx.startswith("environment.framework mxnet: ")
    dl = choose(env(framework_version="1"), BASE, {}).refused
    assert dl is not None and dl.startswith("environment.framework_version 1: ")
    odd = choose(env(framework="pytorch", framework_version="latest"), BASE, {}).refused
    assert odd is not None and odd.startswith("environment.framework_version 'latest'")


def test_the_operators_map_wins_and_covers_other_pythons() -> None:
    m = parse_env_map(" py3.10-pytorch-2.1=reg.example/env/torch:2.1 , py3.11-deep_learning=x/y:1")
    assert m == {"py3.10-pytorch-2.1": "reg.example/env/torch:2.1", "py3.11-deep_learning": "x/y:1"}
    c = choose(env(python_version="3.10", framework="pytorch", framework_version="2.1"), BASE, m)
    assert (c.image, c.mapped, c.steps) == ("reg.example/env/torch:2.1", True, ())
    assert choose(env(), BASE, m).image == "x/y:1"
    refused = choose(env(python_version="3.12"), BASE, m).refused
    assert refused is not None and "py3.10-pytorch-2.1" in refused
    for bad in ("torch", "py3.10-pytorch-2.1=", "=img", "nope=img"):
        with pytest.raises(ValueError, match="is not <environment>=<image>"):
            parse_env_map(bad)
    assert parse_env_map("") == {}


def test_pip_packages_on_the_bare_base_image_go_into_its_pip_ready_environment() -> None:
    pip_env = with_pip(choose(env(), BASE, {}), BASE)
    assert pip_env.image == "localhost/gpufleet/env:py3.11-deep_learning"
    assert [(s.kind, s.items) for s in pip_env.steps] == [("apt", ("python3-pip",))]
    torch = choose(env(framework="pytorch", framework_version="2.3"), BASE, {})
    assert with_pip(torch, BASE) == torch  # has pip already
    mapped = choose(env(), BASE, {"py3.11-deep_learning": "x/y:1"})
    assert with_pip(mapped, BASE) == mapped


def test_a_notebooks_environment_adds_jupyterlab_wheels_to_its_environment_once() -> None:
    plain = with_jupyter(choose(env(), BASE, {}), BASE)
    assert plain.image == "localhost/gpufleet/env:py3.11-deep_learning-notebook"
    assert (plain.from_image, plain.first) == (BASE, None)
    assert [(s.kind, s.items, s.binary_only) for s in plain.steps] == [
        ("apt", ("python3-pip",), False),
        ("pip", ("jupyterlab>=4,<5",), True),
    ]
    torch = choose(env(framework="pytorch", framework_version="2.3"), BASE, {})
    nb = with_jupyter(torch, BASE)
    assert nb.image == "localhost/gpufleet/env:py3.11-pytorch-2.3-notebook"
    assert (nb.from_image, nb.first) == (torch.image, torch)  # the framework's, built first
    assert [(s.kind, s.items, s.binary_only) for s in nb.steps] == [
        ("pip", ("jupyterlab>=4,<5",), True)
    ]
    assert with_pip(nb, BASE) == nb  # a notebook's packages go on top of it
    mapped = choose(env(), BASE, {"py3.11-deep_learning": "x/y:1"})
    assert with_jupyter(mapped, BASE) == mapped  # the operator's image, as it is
    refused = choose(env(python_version="3.10"), BASE, {})
    assert with_jupyter(refused, BASE) == refused


TRIPLES = [
    {"python_version": py, "framework": fw, "framework_version": v}
    for py in ("3.8", "3.10", "3.11", "3.12")
    for fw in ("deep_learning", "pytorch", "tensorflow", "mxnet")
    for v in (None, "2.1", "2.3", "2.*", "1.9", "latest")
]
MAPS = [
    {},
    {"py3.10-pytorch-2.1": "r/torch:2.1", "py3.8-mxnet-1.9": "r/mx:1.9"},
    {"py3.12-deep_learning": "r/dl:3.12", "py3.11-pytorch-latest": "r/torch:nightly"},
]


def test_what_a_node_announces_is_what_it_runs() -> None:
    """The registration's offer (gpufleet_contracts.environments) against `choose`: a triple
    is offered exactly when this node would not refuse it, for every map."""
    assert offer({}) == BUILT_IN  # what the scheduler assumes of a node that announced none
    for env_map in MAPS:
        announced = offer(env_map)
        assert announced.mapped == tuple(sorted(env_map))
        for triple in TRIPLES:
            base = BaseEnvironment.model_validate(triple)
            runs = choose(base.model_dump(mode="json"), BASE, env_map).refused is None
            assert announced.offers(base) == runs, (triple, env_map)


def test_a_map_larger_than_a_registration_may_announce_is_refused_at_start() -> None:
    text = ",".join(f"py3.10-pytorch-2.{i}=r/t:{i}" for i in range(limits.NODE_ENVIRONMENTS + 1))
    with pytest.raises(ValueError, match="at most"):
        parse_env_map(text)
    with pytest.raises(ValueError, match="is not <environment>=<image>"):
        parse_env_map("py3.10-" + "x" * 200 + "=r/t:1")


async def test_the_registration_announces_the_nodes_environments(tmp_path: Path) -> None:
    from .test_agent import agent  # the agent whole; the rules above need none of it

    a = agent(tmp_path, base_environments="py3.10-pytorch-2.1=reg.example/env/torch:2.1")
    await a.prepare()
    reg = a.registration()
    assert reg.environments == EnvironmentOffer(
        python_versions=("3.11",),
        frameworks=("deep_learning", "pytorch", "tensorflow"),
        mapped=("py3.10-pytorch-2.1",),
    )
    plain = agent(tmp_path / "plain")
    await plain.prepare()
    assert plain.registration().environments == BUILT_IN


class Built:
    """A builder that notes what it is asked to make sure of (builds.Builder's `ensure`)."""

    def __init__(self) -> None:
        self.ensured: list[tuple[str, str, list[str]]] = []

    async def ensure(self, tag: str, from_image: str, steps: Any, say: Any) -> str | None:
        self.ensured.append((tag, from_image, [s.kind for s in steps]))
        return None


async def test_a_notebook_gets_its_framework_built_then_jupyterlab_on_it(tmp_path: Path) -> None:
    async def podman(*args: str) -> tuple[int, bytes, bytes]:
        return 0, b"1000", b""  # an image's size (images.size_error)

    spec = WorkerSpec(
        placement_id="pl-1",
        job_id="j1",
        worker=0,
        command=NOTEBOOK_COMMAND,
        serving=Serving(kind="notebook", health_path="/api"),
        base_environment=BaseEnvironment(
            python_version="3.11", framework="pytorch", framework_version="2.3"
        ),
    )
    builder = Built()
    config = PodmanConfig(image=BASE)
    image, error = await prepare_image(podman, builder, Worker(spec, tmp_path), config)  # type: ignore[arg-type]
    torch = "localhost/gpufleet/env:py3.11-pytorch-2.3"
    assert (image, error) == (f"{torch}-notebook", None)
    assert builder.ensured == [(torch, BASE, ["apt", "pip"]), (f"{torch}-notebook", torch, ["pip"])]
    plain = spec.model_copy(update={"serving": None, "command": ("train",)})
    assert needs_preparing(plain.model_copy(update={"base_environment": None}), config) is False
    notebook = spec.model_copy(update={"base_environment": None})
    assert needs_preparing(notebook, config) is True  # the base image has no JupyterLab
