"""Base environments as data (R-JOB-7): the tag that names a (Python version, framework,
framework version) triple, what a node offers (`EnvironmentOffer`, which its agent announces
in RegisterNode), and what every gpufleet node builds without an operator's map (`BUILT_IN`).

A node builds base environments for its own Python (Debian bookworm's 3.11, the base image's)
with `deep_learning` (no version) or `pytorch` / `tensorflow` (any version the package index
has wheels of), and runs the images its operator maps by tag (GPUFLEET_BASE_ENVIRONMENTS,
`py3.10-pytorch-2.1=registry/env:tag`): services/node-agent/README.md, "Base environments and
packages". The scheduler refuses at submission a triple no node offers and places a worker
only on a node that offers its triple (services/scheduler/README.md, "Base environments").
Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from . import limits
from .jobspec import BaseEnvironment, Framework

GENERIC = Framework.deep_learning.value  # nothing to version: the base image's own Python
FRAMEWORK_VERSION = re.compile(r"^[0-9][0-9A-Za-z.*+!]{0,63}$")  # a pip version: 2.3, 2.*
TAG = re.compile(r"^py[0-9][0-9.]*-[a-z_]+(-[A-Za-z0-9_.-]+)?$")  # py3.10-pytorch-2.1
TAG_CHARS = 128
MAPPED_SHOWN = 24  # mapped tags a refusal lists before "and N more"

EnvTag = Annotated[str, Field(pattern=TAG.pattern, max_length=TAG_CHARS)]
PythonVersion = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)*$", max_length=16)]
FrameworkName = Annotated[str, Field(pattern=r"^[a-z_]+$", max_length=64)]


@functools.lru_cache(maxsize=4096)
def env_tag(python_version: str, framework: str, framework_version: str | None) -> str:
    """`py3.11-pytorch-2.3`: the triple as an image tag (`*` as `x`: `2.*` is `2.x`; no
    version: `latest`, except `deep_learning`, which has none). The key of an operator's map."""
    if framework == GENERIC and framework_version is None:
        return f"py{python_version}-{framework}"
    version = "latest" if framework_version is None else framework_version
    version = re.sub(r"[^A-Za-z0-9_.-]", "_", version.replace("*", "x"))
    return f"py{python_version}-{framework}-{version}"


def tag_of(base: BaseEnvironment) -> str:
    return env_tag(base.python_version, base.framework.value, base.framework_version)


@functools.lru_cache(maxsize=4096)
def buildable_version(framework: str, version: str | None) -> bool:
    """Whether a node that builds `framework` builds it at `version`: `deep_learning` only
    without one; the others without one (the index's newest) or at a pip version."""
    if framework == GENERIC:
        return version is None
    return version is None or FRAMEWORK_VERSION.fullmatch(version) is not None


class EnvironmentOffer(BaseModel):
    """The base environments a node can run: those it builds, for each of `python_versions`
    with each of `frameworks` (at the versions `buildable_version` accepts), and the images
    its operator maps, by tag."""

    model_config = ConfigDict(frozen=True, extra="allow")

    python_versions: tuple[PythonVersion, ...] = Field(default=(), max_length=16)
    frameworks: tuple[FrameworkName, ...] = Field(default=(), max_length=16)
    mapped: tuple[EnvTag, ...] = Field(default=(), max_length=limits.NODE_ENVIRONMENTS)

    def builds(self, base: BaseEnvironment) -> bool:
        return (
            base.python_version in self.python_versions
            and base.framework.value in self.frameworks
            and buildable_version(base.framework.value, base.framework_version)
        )

    def offers(self, base: BaseEnvironment) -> bool:
        """Whether a worker of `base` runs here (what the node's environments.choose does
        not refuse)."""
        return self.builds(base) or (bool(self.mapped) and tag_of(base) in self.mapped)

    def has_python(self, python_version: str) -> bool:
        prefix = f"py{python_version}-"
        return python_version in self.python_versions or any(
            t.startswith(prefix) for t in self.mapped
        )

    def has_framework(self, python_version: str, framework: str) -> bool:
        prefix = f"py{python_version}-{framework}"
        if python_version in self.python_versions and framework in self.frameworks:
            return True
        return any(t == prefix or t.startswith(prefix + "-") for t in self.mapped)


# What every gpufleet node builds, its operator's map aside (the node agent's environments.py
# announces the same): the offer of a node whose agent announced none (older than the
# announcement), and what a fleet without nodes is judged by.
BUILT_IN = EnvironmentOffer(
    python_versions=("3.11",),
    frameworks=(Framework.deep_learning.value, Framework.pytorch.value, Framework.tensorflow.value),
)


def distinct(offers: Iterable[EnvironmentOffer]) -> list[EnvironmentOffer]:
    """`offers` without repeats (a fleet's nodes mostly offer the same)."""
    seen: dict[tuple[tuple[str, ...], ...], EnvironmentOffer] = {}
    for o in offers:
        seen.setdefault((o.python_versions, o.frameworks, o.mapped), o)
    return list(seen.values())


def unoffered_field(offers: Sequence[EnvironmentOffer], base: BaseEnvironment) -> str:
    """The part of `base` that none of `offers` has (the environment's field that a refusal
    names): its Python version, else its framework (with that Python), else its version."""
    if not any(o.has_python(base.python_version) for o in offers):
        return "python_version"
    if not any(o.has_framework(base.python_version, base.framework.value) for o in offers):
        return "framework"
    return "framework_version"


def describe(offers: Sequence[EnvironmentOffer]) -> str:
    """What `offers` offer together, for a refusal's `valid`: `Python 3.11 with
    deep_learning (no version), pytorch or tensorflow (a version or none); mapped:
    py3.10-pytorch-2.1; or a customer image (environment.image)`."""
    built: dict[str, set[str]] = {}
    for o in offers:
        for py in o.python_versions:
            built.setdefault(py, set()).update(o.frameworks)
    parts = []
    for py in sorted(built):
        frameworks = sorted(built[py])
        named = [f"{f} (no version)" if f == GENERIC else f for f in frameworks]
        versioned = " (a version or none)" if any(f != GENERIC for f in frameworks) else ""
        parts.append(f"Python {py} with {_or(named)}{versioned}")
    mapped = sorted({t for o in offers for t in o.mapped})
    if mapped:
        more = len(mapped) - MAPPED_SHOWN
        shown = ", ".join(mapped[:MAPPED_SHOWN]) + (f" and {more} more" if more > 0 else "")
        parts.append(f"mapped: {shown}")
    parts.append("or a customer image (environment.image)")
    return "; ".join(parts)


def _or(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]
