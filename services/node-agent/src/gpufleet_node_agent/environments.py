"""Base environments (R-JOB-7): the image a job without its own image runs in, chosen from
its (Python version, framework, framework version). Pure: builds.py builds what this says.

- The operator's map (`GPUFLEET_BASE_ENVIRONMENTS`, `py3.10-pytorch-2.1=registry/env:tag,...`,
  keyed by `env_tag`) wins: that image, pulled when it is not in the store.
- Python 3.11 (Debian bookworm's, the base image's) with `deep_learning` and no version:
  the node's base image itself, nothing to build; for a job with pip or requirements.txt
  packages, `localhost/gpufleet/env:py3.11-deep_learning` (the base image with Debian's
  `python3-pip`), built once per node, so a package build does not install pip each time.
- Python 3.11 with `pytorch` or `tensorflow`: `localhost/gpufleet/env:py3.11-pytorch-2.3`,
  built once per node FROM the base image: Debian's `python3-pip`, then the framework's
  wheels from the package index (`torch==2.3`, `--only-binary :all:`: no package code runs,
  so the image, shared by every account, is made of Debian's and the index's files only).
  No version: the newest the index has, tagged `latest` (built once, then kept).
- Anything else is refused, naming the field: another Python version (bookworm has 3.11
  only), `mxnet` (retired: no wheels for Python 3.11 on PyPI), a version on `deep_learning`.
- A notebook (R-JOB-1) runs in its environment with JupyterLab: `<its tag>-notebook`, built
  once per node FROM that environment's image (the base image, or the framework's, built
  first): Debian's `python3-pip` where it has no pip, then `jupyterlab>=4,<5` from the
  index, wheels only, as the frameworks are. An operator's mapped image is taken as it is:
  that it has JupyterLab is the operator's to see to.

What this says a node runs, `offer` announces in RegisterNode (gpufleet_contracts.environments:
the scheduler refuses a triple no node offers and places a worker only where it is offered);
the two agree (tests/unit/node_agent/test_environments.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet_contracts import limits
from gpufleet_contracts.environments import FRAMEWORK_VERSION as VERSION
from gpufleet_contracts.environments import GENERIC, TAG_CHARS, EnvironmentOffer
from gpufleet_contracts.environments import TAG as TAG_KEY
from gpufleet_contracts.environments import env_tag as env_tag

from .packages import Step

NODE_PYTHON = "3.11"  # Debian bookworm's python3, in the base image (baseimage.py)
ENV_REPO = "localhost/gpufleet/env"
FRAMEWORK_PACKAGES = {"pytorch": "torch", "tensorflow": "tensorflow"}
JUPYTERLAB = "jupyterlab>=4,<5"
NOTEBOOK_SUFFIX = "-notebook"


@dataclass(frozen=True)
class EnvChoice:
    """Where a worker's environment comes from: `image` as is (`mapped`: the operator's,
    pulled when missing), or built from `from_image` with `steps`; or `refused`."""

    image: str = ""
    from_image: str = ""
    steps: tuple[Step, ...] = ()
    mapped: bool = False
    refused: str | None = None
    first: EnvChoice | None = None  # built before this one, which is built FROM its image


def parse_env_map(text: str) -> dict[str, str]:
    """GPUFLEET_BASE_ENVIRONMENTS: `<env tag>=<image>` entries, comma-separated."""
    found: dict[str, str] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        key, sep, image = (p.strip() for p in entry.partition("="))
        if (
            not sep
            or not TAG_KEY.fullmatch(key)
            or len(key) > TAG_CHARS
            or not image
            or " " in image
        ):
            raise ValueError(
                f"{entry.strip()!r} is not <environment>=<image>, "
                "e.g. py3.10-pytorch-2.1=registry.example/envs/torch:2.1"
            )
        found[key] = image
    if len(found) > limits.NODE_ENVIRONMENTS:  # more than a registration may announce
        raise ValueError(f"{len(found)} base environments; at most {limits.NODE_ENVIRONMENTS}")
    return found


def offer(env_map: Mapping[str, str]) -> EnvironmentOffer:
    """What this node runs, as its registration announces it: the triples `choose` builds
    (Python NODE_PYTHON with `deep_learning` or a framework of FRAMEWORK_PACKAGES), and the
    operator's mapped tags."""
    return EnvironmentOffer(
        python_versions=(NODE_PYTHON,),
        frameworks=(GENERIC, *FRAMEWORK_PACKAGES),
        mapped=tuple(sorted(env_map)),
    )


def choose(env: Mapping[str, Any] | None, base_image: str, env_map: Mapping[str, str]) -> EnvChoice:
    """The image for StartWorker's `base_environment` (as in spec.json); None (an older
    scheduler): the base image."""
    if not env:
        return EnvChoice(image=base_image)
    python = str(env.get("python_version") or NODE_PYTHON)
    framework = str(env.get("framework") or GENERIC)
    raw_version = env.get("framework_version")
    version = None if raw_version is None else str(raw_version)
    tag = env_tag(python, framework, version)
    if tag in env_map:
        return EnvChoice(image=env_map[tag], mapped=True)
    mapped = f" (this node's operator maps: {', '.join(sorted(env_map))})" if env_map else ""
    if python != NODE_PYTHON:
        return EnvChoice(
            refused=f"environment.python_version {python}: this node builds base environments "
            f"for Python {NODE_PYTHON} only (Debian bookworm's){mapped}; "
            "use a customer image (environment.image) for another version"
        )
    if framework == GENERIC:
        if version is not None:
            return EnvChoice(
                refused=f"environment.framework_version {version}: {GENERIC} has no versions "
                "here; leave it out, or choose pytorch or tensorflow"
            )
        return EnvChoice(image=base_image)
    package = FRAMEWORK_PACKAGES.get(framework)
    if package is None:
        return EnvChoice(
            refused=f"environment.framework {framework}: no base environment on this node "
            f"(no wheels for Python {NODE_PYTHON} on PyPI){mapped}; "
            "choose pytorch or tensorflow, or a customer image"
        )
    if version is not None and not VERSION.fullmatch(version):
        return EnvChoice(
            refused=f"environment.framework_version {version!r}: not a version "
            "(e.g. 2.3, 2.3.1 or 2.*)"
        )
    requirement = package if version is None else f"{package}=={version}"
    return EnvChoice(
        image=f"{ENV_REPO}:{tag}",
        from_image=base_image,
        steps=(Step("apt", ("python3-pip",)), Step("pip", (requirement,), binary_only=True)),
    )


def with_pip(choice: EnvChoice, base_image: str) -> EnvChoice:
    """`choice`, or, when it is the bare base image (no pip), its pip-ready environment."""
    if choice.image != base_image or choice.steps or choice.mapped:
        return choice
    return EnvChoice(
        image=f"{ENV_REPO}:{env_tag(NODE_PYTHON, GENERIC, None)}",
        from_image=base_image,
        steps=(Step("apt", ("python3-pip",)),),
    )


def with_jupyter(choice: EnvChoice, base_image: str) -> EnvChoice:
    """`choice` with JupyterLab, for a notebook: its `-notebook` environment, built FROM its
    image (`first` when that is built too); a refusal or an operator's image as it is."""
    if choice.refused is not None or choice.mapped:
        return choice
    jupyter = Step("pip", (JUPYTERLAB,), binary_only=True)
    if choice.image == base_image and not choice.steps:  # the bare base image: no pip
        return EnvChoice(
            image=f"{ENV_REPO}:{env_tag(NODE_PYTHON, GENERIC, None)}{NOTEBOOK_SUFFIX}",
            from_image=base_image,
            steps=(Step("apt", ("python3-pip",)), jupyter),
        )
    return EnvChoice(
        image=f"{choice.image}{NOTEBOOK_SUFFIX}",
        from_image=choice.image,
        steps=(jupyter,),
        first=choice if choice.steps else None,
    )
