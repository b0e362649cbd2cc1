"""A job's packages (R-JOB-7) as plain data: the install plan, in the order apt, conda,
requirements.txt, pip; the shell script a build container runs for it; the key of the image
it makes; and the reason a failed build gives. No I/O here (builds.py runs it).

The script runs as root in a container of the image being extended (its ENTRYPOINT
replaced by `/bin/sh -c`), with the network (services/node-agent/README.md, "Packages").
Before each step it prints a marker line, `==> gpufleet step <name>`, so a failure names
its step. Every package is one shell word (shlex-quoted), and a name with a version spec:
the contract refuses URLs, local paths and installer options
(gpufleet_contracts.package_entries), so none is read as a source or an option.

A requirements.txt found in the job's model code is installed in the requirements.txt step's
place too, before the spec's own lines (`ModelRequirements`, checked line by line with the
same grammar); the image step reads it from the staged model code (steps/image.py).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpufleet_contracts import limits
from gpufleet_contracts.fields import name_problem
from gpufleet_contracts.package_entries import requirements_problem

ORDER = ("apt", "conda", "requirements", "pip")  # R-JOB-7: ... requirements.txt, pip
STEP_NAMES = {"requirements": "requirements.txt"}
MARKER = "==> gpufleet step "
PKG_REPO = "localhost/gpufleet/pkgs"
NO_CONDA = "conda packages need an image with conda (conda, mamba or micromamba on its PATH)"
NO_APT = "apt packages need an image with apt-get (Debian or Ubuntu)"
NO_PYTHON = "pip packages need an image with Python (python3 or python on its PATH)"
NO_PIP = "pip packages need an image with pip (python -m pip) or apt-get to install it"
TAIL_CHARS = 800


@dataclass(frozen=True)
class Step:
    kind: str  # apt | conda | requirements | pip
    items: tuple[str, ...]
    binary_only: bool = False  # pip: wheels only, no package code runs at install
    origin: str = ""  # requirements: the file in the model code they come from, if any

    @property
    def name(self) -> str:
        name = STEP_NAMES.get(self.kind, self.kind)
        return f"{name} ({self.origin})" if self.origin else name


@dataclass(frozen=True)
class ModelRequirements:
    """A requirements.txt found in the job's model code: where (as the job sees it, e.g.
    `/opt/ml/models/requirements.txt`) and its lines, each one R-JOB-7 allows."""

    path: str
    lines: tuple[str, ...]


class UnsafeRequirement(Exception):
    """A line of a model's requirements.txt that a spec's `packages.requirements` could not
    hold (a URL, a path, an option such as `-e .` or `--index-url`): the worker fails with
    this reason before anything is installed."""

    def __init__(self, path: str, number: int, line: str, problem: str) -> None:
        super().__init__(f"{path} line {number}: {line!r}: {problem}")
        self.path, self.number, self.line, self.problem = path, number, line, problem

    @property
    def reason(self) -> str:
        return str(self)


def model_requirements(path: str, text: str) -> ModelRequirements:
    """The requirements.txt at `path` in the model code, whose content is `text`, checked
    line by line as the contract checks `packages.requirements` at submission
    (gpufleet_contracts.package_entries); UnsafeRequirement names the first line refused."""
    lines = tuple(line.strip() for line in text.splitlines())
    count = 0
    for number, line in enumerate(lines, start=1):
        count += bool(_items("requirements", [line]))
        if count > limits.PACKAGES:  # as many as a spec's `packages.requirements` holds
            raise UnsafeRequirement(path, number, line, f"more than {limits.PACKAGES} requirements")
        problem = name_problem(line)
        if problem is None and len(line) > limits.PACKAGE_CHARS:
            problem = f"longer than {limits.PACKAGE_CHARS} characters"
        problem = problem or requirements_problem(line)
        if problem is not None:
            raise UnsafeRequirement(path, number, line, problem)
    return ModelRequirements(path, lines)


def _items(kind: str, entries: Any) -> tuple[str, ...]:
    items = tuple(str(p).strip() for p in entries or [] if str(p).strip())
    return tuple(i for i in items if not (kind == "requirements" and i.startswith("#")))


def plan(
    packages: Mapping[str, Any] | None, model: ModelRequirements | None = None
) -> tuple[Step, ...]:
    """The steps for a job's `packages` (StartWorker's, as in spec.json), in R-JOB-7's
    order; a kind without entries has no step (requirements.txt's comments are none). A
    requirements.txt of the model code (`model`) is a step of its own in the requirements.txt
    place, before the spec's lines (so a pin of the spec's is installed last and holds)."""
    steps = []
    for kind in ORDER:
        if kind == "requirements" and model is not None:
            found = _items(kind, model.lines)
            if found:
                steps.append(Step(kind, found, origin=model.path))
        items = _items(kind, (packages or {}).get(kind))
        if items:
            steps.append(Step(kind, items))
    return tuple(steps)


_PRELUDE = """set -eu
export DEBIAN_FRONTEND=noninteractive PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_PROGRESS_BAR=off
gpufleet_fail() { echo "$1"; exit 3; }
gpufleet_pip() {
  PY=$(command -v python3 || command -v python || true)
  [ -n "$PY" ] || gpufleet_fail '%(no_python)s'
  if ! "$PY" -m pip --version >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || gpufleet_fail '%(no_pip)s'
    echo 'installing pip (Debian python3-pip)'
    apt-get update -q
    apt-get install -y -q --no-install-recommends python3-pip
    rm -rf /var/lib/apt/lists/*
  fi
}
"""


def _words(items: Sequence[str]) -> str:
    return " ".join(shlex.quote(i) for i in items)


def _step_lines(step: Step, delimiter: str) -> list[str]:
    words = _words(step.items)
    if step.kind == "apt":
        return [
            f"command -v apt-get >/dev/null 2>&1 || gpufleet_fail '{NO_APT}'",
            "apt-get update -q",
            f"apt-get install -y -q --no-install-recommends {words}",
            "rm -rf /var/lib/apt/lists/*",
        ]
    if step.kind == "conda":
        return [
            f"if command -v micromamba >/dev/null 2>&1; then micromamba install -y -n base {words}",
            f"elif command -v mamba >/dev/null 2>&1; then mamba install -y {words}",
            f"elif command -v conda >/dev/null 2>&1; then conda install -y {words}",
            f"else gpufleet_fail '{NO_CONDA}'; fi",
        ]
    if step.kind == "requirements":
        return [
            "gpufleet_pip",
            f"cat > /tmp/gpufleet-requirements.txt <<'{delimiter}'",
            *step.items,
            delimiter,
            '"$PY" -m pip install -r /tmp/gpufleet-requirements.txt',
            "rm -f /tmp/gpufleet-requirements.txt",
        ]
    only = "--only-binary :all: " if step.binary_only else ""
    return ["gpufleet_pip", f'"$PY" -m pip install {only}{words}']


def index_env(index_url: str | None) -> dict[str, str]:
    """pip's index settings for the build: the operator's index (GPUFLEET_PACKAGE_INDEX_URL),
    trusted without TLS when it is plain http (the operator named it); else pip's default."""
    if not index_url:
        return {}
    env = {"PIP_INDEX_URL": index_url}
    parts = urlsplit(index_url)
    if parts.scheme == "http" and parts.hostname:
        env["PIP_TRUSTED_HOST"] = parts.hostname
    return env


def script(steps: Sequence[Step], index_url: str | None = None) -> str:
    """The build container's shell script for `steps` (POSIX sh)."""
    lines = [_PRELUDE % {"no_python": NO_PYTHON, "no_pip": NO_PIP}]
    for k, v in index_env(index_url).items():
        lines.append(f"export {k}={shlex.quote(v)}")
    digest = hashlib.sha256(repr(steps).encode()).hexdigest()[:16]
    for step in steps:
        lines.append(f"echo {shlex.quote(MARKER + step.name)}")  # a model file's path too
        lines += _step_lines(step, f"GPUFLEET_EOF_{digest}")
    lines.append(f"echo '{MARKER}done'")
    return "\n".join(lines) + "\n"


def build_key(from_image_id: str, steps: Sequence[Step], index_url: str | None, owner: str) -> str:
    """What a package image is cached by: the exact image it extends (its ID, not a tag a
    pull may move), the steps, the index, and the account whose job asked (an account never
    runs what another account's build made)."""
    data = {
        "from": from_image_id,
        "steps": [[s.kind, list(s.items), s.binary_only] for s in steps],
        "index": index_url or "",
        "owner": owner,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def package_tag(key: str) -> str:
    return f"{PKG_REPO}:{key[:24]}"


def failed_step(output: str) -> str | None:
    """The step the build was in when it ended (its last marker), None before any."""
    last = None
    for line in output.splitlines():
        if line.startswith(MARKER):
            last = line[len(MARKER) :].strip()
    return last


def failure_reason(output: str, rc: int | None, timeout_s: float | None = None) -> str:
    """A failed build's reason: its step and the tail of its output."""
    step = failed_step(output) or "setup"
    tail = output.strip()[-TAIL_CHARS:]
    if timeout_s is not None:
        return f"package step {step} did not finish in {timeout_s:g} s: {tail}"
    return f"package step {step} failed (exit {rc}): {tail}"
