"""A route's request body as a pydantic model of its declared parameters (pydantic 2, or 1
in an older job image).

JSON's types are taken strictly: 3.0 or "3" is no integer, 1 no boolean, 3 no string; an
integer is a float. The fields have names of their own (`p0`, `p1`, ...) and the declared
names as aliases, so that no parameter name clashes with pydantic's (`json`, `model_config`,
`_private`); a body with any other key is refused.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import pydantic
from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from .routes import RouteDef

PYDANTIC_2 = pydantic.VERSION.startswith("2.")

_TYPES: dict[str, Any] = {
    "string": StrictStr,
    "integer": StrictInt,
    # pydantic 1's StrictFloat refuses an integer; the handler makes it a float (as_float)
    "float": StrictFloat if PYDANTIC_2 else Union[StrictFloat, StrictInt],
    "boolean": StrictBool,
    "object": Dict[str, Any],
    "list": List[Any],
}


def field_name(index: int) -> str:
    return f"p{index}"


def model(route: RouteDef, name: str) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for i, p in enumerate(route.body):
        kind = _TYPES[p.type]
        if not p.optional:
            fields[field_name(i)] = (kind, Field(..., alias=p.name, title=p.name))
        else:
            # A default None also lets a client send null; another default is copied per
            # request by pydantic, so a function that changes it changes no later call's.
            kind = Optional[kind] if p.default is None else kind
            fields[field_name(i)] = (kind, Field(p.default, alias=p.name, title=p.name))
    return pydantic.create_model(name, __base__=_Strict, **fields)


def as_float(value: Any) -> Any:
    """A float parameter's value as a float (pydantic 1 leaves an integer as it came)."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


if PYDANTIC_2:

    class _Strict(BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

else:  # pydantic 1, in an older job image

    class _Strict(BaseModel):  # type: ignore[no-redef]
        class Config:
            extra = "forbid"
