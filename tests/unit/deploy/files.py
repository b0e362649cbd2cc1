"""Reading the deployment files as Docker and Compose read them, for the tests beside this
module: docker-compose.yml with its `${VAR:-default}` interpolation, and a Dockerfile's
stages (what each installs with apt-get, copies, and runs as)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERLAY = ROOT / "deploy" / "compose.gpu.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"

# Compose's interpolation: $$ (a literal $), ${VAR}, ${VAR:-default}, ${VAR-default},
# ${VAR:?error}, ${VAR?error}, $VAR.
_VARIABLE = re.compile(
    r"\$(?:(?P<dollar>\$)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class Unset(KeyError):
    """A `${VAR:?error}` whose variable is unset (or empty): compose refuses to start."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """`text` with its variables replaced from `env`, as `docker compose` does."""

    def one(m: re.Match[str]) -> str:
        if m["dollar"]:
            return "$"
        name = m["name"] or m["bare"]
        value, op, arg = env.get(name), m["op"], m["arg"] or ""
        empty = value is None or (op is not None and op.startswith(":") and value == "")
        if op is not None and op.endswith("-"):
            return interpolate(arg, env) if empty else str(value)
        if op is not None and op.endswith("?"):
            if empty:
                raise Unset(f"{name}: {arg}")
            return str(value)
        return "" if value is None else value

    return _VARIABLE.sub(one, text)


def resolved(node: Any, env: Mapping[str, str]) -> Any:
    """Every string of a parsed compose document interpolated."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolved(item, env) for item in node]
    if isinstance(node, dict):
        return {key: resolved(value, env) for key, value in node.items()}
    return node


def load_compose(*files: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose model of `files` (the first, then overlays), its anchors and merge keys
    applied by YAML and its variables from `env` (none set: their defaults). Overlays merge
    as compose merges them: mappings key by key, anything else replaced."""
    model: dict[str, Any] = {}
    for path in files or (COMPOSE,):
        model = _merge(model, resolved(yaml.safe_load(path.read_text()), env or {}))
    return model


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base.get(key), value) if key in base else value
        return out
    return over


def service(model: Mapping[str, Any], name: str) -> dict[str, Any]:
    return dict(model["services"][name])


def environment(svc: Mapping[str, Any]) -> dict[str, str]:
    """A service's environment as its process gets it (a list or a mapping in the file)."""
    raw = svc.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, None) for item in raw)
    out: dict[str, str] = {}
    for key, value in raw.items():
        if value is None:
            continue  # `VAR` alone: from the host's environment, unset here
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def is_root(user: str | None) -> bool:
    """Is `user` (compose's `user:`, a Dockerfile's USER; None: not set, so root) root?"""
    name = (user or "0").split(":", 1)[0]
    return name in ("0", "root")


@dataclass
class Stage:
    """What a Dockerfile stage (with the stages it is built FROM) does."""

    name: str
    base: str
    apt_packages: set[str] = field(default_factory=set)
    copies: list[tuple[str, str]] = field(default_factory=list)  # (source, destination)
    user: str | None = None  # the last USER: None, root
    workdir: str = "/"
    runs: list[str] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuation lines joined, comments out."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, args = current.partition(" ")
        out.append((keyword.upper(), args.strip()))
        current = ""
    return out


def apt_installs(command: str) -> set[str]:
    """The packages an `apt-get install` (or `apt install`) in a shell command installs."""
    packages: set[str] = set()
    for part in re.split(r"&&|\|\||;|\|", command):
        words = shlex.split(part)
        for i in range(len(words) - 1):
            if words[i] in ("apt-get", "apt") and "install" in words[i + 1 :]:
                after = words[words.index("install", i) + 1 :]
                packages |= {w for w in after if not w.startswith("-")}
                break
    return packages


def stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """Every named stage of the Dockerfile at `path`, each with what its bases did."""
    found: dict[str, Stage] = {}
    args: dict[str, str] = {}
    stage: Stage | None = None
    for keyword, rest in _instructions(path.read_text()):
        if keyword == "ARG" and stage is None:  # before the first FROM: usable in FROM
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        elif keyword == "FROM":
            words = rest.split()
            base = interpolate(words[0], args)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else base
            parent = found.get(base)
            stage = Stage(name=name, base=base if parent is None else parent.base)
            if parent is not None:
                stage.apt_packages = set(parent.apt_packages)
                stage.copies = list(parent.copies)
                stage.user, stage.workdir = parent.user, parent.workdir
                stage.runs = list(parent.runs)
            found[name] = stage
        elif stage is None:
            continue
        elif keyword == "RUN":
            command = re.sub(r"^(--\S+\s+)+", "", rest)  # RUN --mount=... options
            stage.runs.append(command)
            stage.apt_packages |= apt_installs(command)
        elif keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            stage.copies += [(source, words[-1]) for source in words[:-1]]
        elif keyword == "USER":
            stage.user = rest
        elif keyword == "WORKDIR":
            stage.workdir = rest
    return found


def built_stage(svc: Mapping[str, Any]) -> Stage:
    """The stage of deploy/Dockerfile a compose service builds its image from (its `target`;
    none: the last stage, as `docker build` does)."""
    build = svc["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    all_stages = stages()
    return all_stages[build["target"]] if "target" in build else list(all_stages.values())[-1]
