"""An endpoint job's routes, parameters and port reservation (R-JOB-6, R-RES-*)."""

from __future__ import annotations

import ast
from enum import StrEnum
from typing import Annotated

from pydantic import (
    BaseModel,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from . import limits
from .errors import rule, ruled
from .fields import Argv, Cap, Name
from .jobspec import _FROZEN, _dups, bad
from .paths import UnsafePath, contained_path

# The generated server's own paths (its health route): no route may be under it. The same
# prefix as gpufleet_endpoint.RESERVED_PREFIX, which runs in the job's container.
RESERVED_PREFIX = "/__gpufleet"


class ParamType(StrEnum):
    string = "string"
    integer = "integer"
    float = "float"
    boolean = "boolean"
    object = "object"
    list = "list"


_LITERAL_TYPES: dict[ParamType, tuple[type, ...]] = {
    ParamType.string: (str,),
    ParamType.integer: (int,),
    ParamType.float: (float, int),
    ParamType.boolean: (bool,),
    ParamType.object: (dict,),
    ParamType.list: (list, tuple),
}


@ruled
class RouteParam(BaseModel):
    model_config = _FROZEN

    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        json_schema_extra=rule("R-JOB-6", **{"x-valid": "a Python identifier"}),
    )
    type: ParamType = Field(json_schema_extra=rule("R-JOB-6"))
    optional: bool = False
    default: str | None = Field(
        default=None,
        json_schema_extra=rule("R-JOB-6", **{"x-valid": "a Python literal, e.g. None, 0, 'x'"}),
    )

    @model_validator(mode="after")
    def _default(self) -> RouteParam:
        if not self.optional:
            if self.default is not None:
                raise bad(
                    "default_not_optional",
                    "parameter {name!r} has a default but is not optional",
                    "R-JOB-6",
                    "optional: true, or no default",
                    name=self.name,
                )
            return self
        if self.default is None:
            raise bad(
                "default_required",
                "optional parameter {name!r} needs a default",
                "R-JOB-6",
                "a Python literal, e.g. None",
                name=self.name,
            )
        try:
            value = ast.literal_eval(self.default)
        except (ValueError, SyntaxError) as exc:
            raise bad(
                "default_literal",
                "default of {name!r} is not a valid Python literal: {default!r}",
                "R-JOB-6",
                "a Python literal (None, not null)",
                name=self.name,
                default=self.default,
            ) from exc
        ok = _LITERAL_TYPES[self.type]
        if value is not None and (
            not isinstance(value, ok) or (self.type is not ParamType.boolean and value is True)
        ):
            raise bad(
                "default_type",
                "default of {name!r} is not a {type}",
                "R-JOB-6",
                f"a {self.type.value} literal or None",
                name=self.name,
                type=self.type.value,
            )
        return self


def _route_file(v: str, why: str) -> PydanticCustomError:
    return bad(
        "route_file",
        "route file must be a relative .py path inside the model code, got {v!r}: {why}",
        "R-JOB-6",
        "e.g. subdir/predict.py",
        v=v,
        why=why,
    )


@ruled
class Route(BaseModel):
    model_config = _FROZEN

    verb: str = Field(
        default="POST", json_schema_extra=rule("R-JOB-6", **{"x-valid": "POST (the only verb)"})
    )
    path: str = Field(
        pattern=r"^/[A-Za-z0-9_\-./{}]*$",
        max_length=256,
        json_schema_extra=rule("R-JOB-6", **{"x-valid": "a URL path starting with /"}),
    )
    file: str = Field(
        json_schema_extra=rule("R-JOB-6", **{"x-valid": "relative .py path in the model code"})
    )
    function: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        json_schema_extra=rule("R-JOB-6", **{"x-valid": "a Python function name"}),
    )
    positional: bool = False
    body: Annotated[
        list[RouteParam], Cap(limits.ROUTE_PARAMS, "route_params", "body parameters")
    ] = Field(default_factory=list, json_schema_extra=rule("R-JOB-6"))

    @field_validator("verb")
    @classmethod
    def _post_only(cls, v: str) -> str:
        if v.upper() != "POST":
            raise bad("verb", "only POST routes are supported, got {v}", "R-JOB-6", "POST", v=v)
        return "POST"

    @field_validator("path")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v.split("/")[1] == RESERVED_PREFIX[1:]:
            raise bad(
                "route_reserved",
                "paths under {prefix}/ are the endpoint server's own, got {v}",
                "R-JOB-6",
                f"a path outside {RESERVED_PREFIX}/",
                prefix=RESERVED_PREFIX,
                v=v,
            )
        return v

    @field_validator("file")
    @classmethod
    def _relative_py(cls, v: str) -> str:
        """Kept in its canonical (decoded) form, the one checked (gpufleet_contracts.paths)."""
        try:
            file = contained_path(v, rooted=False)
        except UnsafePath as exc:
            raise _route_file(v, str(exc)) from exc
        if file.startswith("$"):
            raise _route_file(v, "a variable, not a path inside the model code")
        if not file.endswith(".py"):
            raise _route_file(v, "not a .py file")
        return file

    @field_validator("body")
    @classmethod
    def _unique_params(cls, v: list[RouteParam]) -> list[RouteParam]:
        dup = _dups(p.name for p in v)
        if dup:
            raise bad(
                "param_unique",
                "body parameter name(s) used twice: {dup}",
                "R-JOB-6",
                "unique parameter names",
                dup=", ".join(dup),
            )
        return v


@ruled
class Reservation(BaseModel):
    """A regional port reservation the job serves on (R-RES-3); pins the region."""

    model_config = _FROZEN

    region: Name = Field(
        min_length=1, max_length=limits.NAME_CHARS, json_schema_extra=rule("R-RES-3")
    )
    name: Name = Field(
        min_length=1, max_length=limits.NAME_CHARS, json_schema_extra=rule("R-RES-3")
    )


@ruled
class EndpointSpec(BaseModel):
    model_config = _FROZEN

    server_command: Argv | None = Field(
        default=None,
        json_schema_extra=rule("R-JOB-6", **{"x-valid": "a command serving on port 80"}),
    )
    routes: Annotated[list[Route], Cap(limits.ROUTES, "routes", "routes")] = Field(
        default_factory=list, json_schema_extra=rule("R-JOB-6")
    )
    # What the node's proxy probes before requests go through (a manual server only: the
    # route server has its own health route); None: `/`.
    health_path: str | None = Field(
        default=None,
        pattern=r"^/[A-Za-z0-9_\-./]*$",
        max_length=256,
        json_schema_extra=rule("R-JOB-6", **{"x-valid": "a URL path starting with /"}),
    )

    @model_validator(mode="after")
    def _one_way(self) -> EndpointSpec:
        if bool(self.server_command) == bool(self.routes):
            raise bad(
                "endpoint_mode",
                "an endpoint has either a manual server_command or routes (exactly one)",
                "R-JOB-6",
                "server_command: [...] (listening on port 80) or routes: [...]",
            )
        if self.health_path is not None and not self.server_command:
            raise bad(
                "health_path_server",
                "health_path is for a manual server_command; routes have their own",
                "R-JOB-6",
                "no health_path with routes",
            )
        dup = _dups(f"{r.verb} {r.path}" for r in self.routes)
        if dup:
            raise bad(
                "route_unique",
                "two routes share verb + path: {dup}",
                "R-JOB-6",
                "unique verb + path per route",
                dup=", ".join(dup),
            )
        return self


# --- environment (R-JOB-7) ------------------------------------------------------------
