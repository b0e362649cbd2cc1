"""The routes file: a JSON list of the contract's routes (`Route.model_dump(mode="json")`),
read into plain frozen records and checked again, since this side cannot import the contract."""

from __future__ import annotations

import ast
import json
import keyword
from dataclasses import dataclass
from typing import Any

from . import RESERVED_PREFIX, StartError

TYPES = ("string", "integer", "float", "boolean", "object", "list")


@dataclass(frozen=True)
class Param:
    """A body parameter; `default` is the Python value of its declared literal."""

    name: str
    type: str
    optional: bool = False
    default: Any = None


@dataclass(frozen=True)
class RouteDef:
    path: str
    file: str  # relative to the model code
    function: str
    positional: bool = False
    body: tuple[Param, ...] = ()


def read(path: str) -> list[RouteDef]:
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except OSError as exc:
        raise StartError(f"cannot read the routes file {path}: {exc}") from None
    except ValueError as exc:
        raise StartError(f"the routes file {path} is not JSON: {exc}") from None
    return parse(data)


def parse(data: Any) -> list[RouteDef]:
    if not isinstance(data, list) or not data:
        raise StartError("the routes file must hold a non-empty JSON list of routes")
    routes = [_route(i, r) for i, r in enumerate(data)]
    seen: set[str] = set()
    for r in routes:
        if r.path in seen:
            raise StartError(f"two routes share POST {r.path}")
        seen.add(r.path)
    return routes


def _route(i: int, data: Any) -> RouteDef:
    if not isinstance(data, dict):
        raise StartError(f"route #{i} is not a JSON object")
    path = _field(data, "path", str, f"route #{i}")
    where = f"route {path}"
    if not path.startswith("/"):
        raise StartError(f"{where}: the path must start with /")
    if path.split("/")[1] == RESERVED_PREFIX[1:]:
        raise StartError(f"{where}: paths under {RESERVED_PREFIX}/ are gpufleet's own")
    verb = data.get("verb", "POST")
    if not isinstance(verb, str) or verb.upper() != "POST":
        raise StartError(f"{where}: only POST routes are served, not {verb!r}")
    function = _field(data, "function", str, where)
    if not function.isidentifier() or keyword.iskeyword(function):
        raise StartError(f"{where}: {function!r} is not a Python function name")
    body = data.get("body") or []
    if not isinstance(body, list):
        raise StartError(f"{where}: body must be a list of parameters")
    params = tuple(_param(where, p) for p in body)
    names = [p.name for p in params]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StartError(f"{where}: body parameter(s) named twice: {', '.join(twice)}")
    return RouteDef(
        path=path,
        file=_field(data, "file", str, where),
        function=function,
        positional=data.get("positional") is True,
        body=params,
    )


def _param(where: str, data: Any) -> Param:
    if not isinstance(data, dict):
        raise StartError(f"{where}: a body parameter is not a JSON object")
    name = _field(data, "name", str, where)
    where = f"{where}, parameter {name!r}"
    if not name.isidentifier() or keyword.iskeyword(name):
        raise StartError(f"{where}: not a Python identifier")
    type_ = _field(data, "type", str, where)
    if type_ not in TYPES:
        raise StartError(f"{where}: type {type_!r} is not one of {', '.join(TYPES)}")
    if data.get("optional") is not True:
        return Param(name, type_)
    literal = data.get("default")
    if not isinstance(literal, str):
        raise StartError(f"{where}: optional, so it needs a default (a Python literal)")
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        raise StartError(f"{where}: the default {literal!r} is not a Python literal") from None
    if type_ == "float" and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif type_ == "list" and isinstance(value, tuple):
        value = list(value)
    return Param(name, type_, optional=True, default=value)


def _field(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise StartError(f"{where}: {key!r} must be a {kind.__name__}")
    return value
