"""Structured errors: every refusal names the field, the rule it broke and what would be valid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .base import Message

M = TypeVar("M", bound=BaseModel)


def rule(rule_id: str, **extra: Any) -> dict[str, Any]:
    """`json_schema_extra` for a field governed by a PRODUCT.md rule."""
    return {"x-rule": rule_id, **extra}


class FieldError(BaseModel):
    model_config = ConfigDict(frozen=True)

    field: str
    rule: str
    message: str
    valid: str | None = None


class ErrorBody(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: str  # invalid | not_found | conflict | unavailable | internal
    message: str
    fields: list[FieldError] = Field(default_factory=list)


class ErrorReply(Message):
    """Reply to a request that was refused. Nothing was stored."""

    TYPE = "gpufleet.error.v1"
    ok: Literal[False] = False
    error: ErrorBody


_RULED: list[type[BaseModel]] = []


def ruled(model: type[M]) -> type[M]:
    """Class decorator: register a model whose fields carry rules, so errors raised while
    validating a message that contains it (found by field path) still name their rule."""
    _RULED.append(model)
    return model


def _field_rule(model: type[BaseModel], name: str) -> tuple[str | None, str | None]:
    info = model.model_fields.get(name)
    extra = info.json_schema_extra if info is not None else None
    if isinstance(extra, dict):
        r, v = extra.get("x-rule"), extra.get("x-valid")
        return (None if r is None else str(r)), (None if v is None else str(v))
    return None, None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside an annotation (`X`, `X | None`, `list[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _walk(model: type[BaseModel], path: list[str]) -> tuple[str | None, str | None]:
    """The rule of the deepest ruled field along `path` from `model` (list indexes skipped)."""
    found: tuple[str | None, str | None] = (None, None)
    current: type[BaseModel] | None = model
    for part in path:
        if part.isdigit():
            continue
        info = current.model_fields.get(part) if current is not None else None
        if info is None:
            break
        rule_here = _field_rule(current, part) if current is not None else (None, None)
        if rule_here[0]:
            found = rule_here
        current = _model_in(info.annotation)
    return found


def _rule_for(loc: list[str], model: type[BaseModel] | None) -> tuple[str | None, str | None]:
    if model is not None and loc:
        found = _field_rule(model, loc[0])
        if found[0]:
            return found
    # Along the path first: "spec.datasets.0.name" is Dataset.name inside JobSpec.datasets;
    # models that are parts of other ruled models are tried after those that are not.
    nested = {_model_in(f.annotation) for m in _RULED for f in m.model_fields.values()}
    ordered = sorted(_RULED, key=lambda m: m in nested)
    for i in range(len(loc)):
        for candidate in ordered:
            if loc[i] in candidate.model_fields:
                found = _walk(candidate, loc[i:])
                if found[0]:
                    return found
    # Deepest named field first: "spec.gpu_types" is JobSpec.gpu_types.
    for i in range(len(loc) - 1, -1, -1):
        for candidate in _RULED:
            found = _field_rule(candidate, loc[i])
            if found[0]:
                return found
    return None, None


def field_errors(exc: ValidationError, model: type[BaseModel] | None = None) -> list[FieldError]:
    """Turn pydantic's errors into FieldErrors, taking each rule from the error or the field."""
    out: list[FieldError] = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        if loc and loc[0] == "body":  # FastStream names the decoded payload "body"
            loc = loc[1:]
        ctx = err.get("ctx") or {}
        rule_id = ctx.get("rule")
        valid = ctx.get("valid")
        if rule_id is None:
            rule_id, default_valid = _rule_for(loc, model)
            valid = valid or default_valid
        out.append(
            FieldError(
                field=".".join(loc) or "(message)",
                rule=str(rule_id or f"schema:{err['type']}"),
                message=err["msg"],
                valid=None if valid is None else str(valid),
            )
        )
    return out


def invalid(message: str, exc: ValidationError, model: type[BaseModel] | None = None) -> ErrorReply:
    return ErrorReply(
        error=ErrorBody(code="invalid", message=message, fields=field_errors(exc, model))
    )


def error(code: str, message: str) -> ErrorReply:
    return ErrorReply(error=ErrorBody(code=code, message=message))


class Refused(Exception):
    """A request refused by a rule (or an object that is not the caller's): answered with
    its ErrorReply, never retried, never dead-lettered. The one refusal of every service;
    the request runtime (gpufleet_bus.requests) turns it into the reply."""

    def __init__(
        self,
        code: str,
        message: str,
        fields: Sequence[FieldError | Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(message)
        self.reply = ErrorReply(
            error=ErrorBody(
                code=code,
                message=message,
                fields=[f if isinstance(f, FieldError) else FieldError(**f) for f in fields],
            )
        )

    @classmethod
    def of_field(
        cls, code: str, message: str, *, field: str, rule: str, says: str, valid: str | None = None
    ) -> Refused:
        """A refusal because of one field: `message`, and that field's error (`says`, under
        `rule`, and what would be `valid`)."""
        return cls(code, message, [FieldError(field=field, rule=rule, message=says, valid=valid)])

    @property
    def code(self) -> str:
        return self.reply.error.code

    @property
    def message(self) -> str:
        return self.reply.error.message

    @property
    def fields(self) -> list[FieldError]:
        return list(self.reply.error.fields)


class NotFound(Refused):
    """Not found, or not the caller's: both answer alike (another account's objects are
    "not found")."""

    def __init__(self, message: str = "not found") -> None:
        super().__init__("not_found", message)
