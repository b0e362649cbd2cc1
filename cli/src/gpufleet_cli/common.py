"""What every command group shares: the --json option and one request-and-print step."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

import typer
from gpufleet_contracts import invalid
from gpufleet_contracts.base import Command
from pydantic import BaseModel, ValidationError

from . import client, render

C = TypeVar("C", bound=Command)
R = TypeVar("R", bound=BaseModel)

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print only the service's JSON object on stdout.")
]


def build(model: type[C], as_json: bool, /, **values: Any) -> C:
    """A request model from the command line's values; values it refuses are reported as the
    service would refuse them (each field and rule, exit 2), before anything is sent."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        refused = invalid(client.INVALID_REQUEST, exc, model).model_dump(mode="json")
        render.fail(client.ServiceError(refused), as_json)


def answer(request: Command, reply: type[R], as_json: bool) -> R:
    """Ask `request`; its reply as `reply`, and with --json printed as the service sent it.
    Errors are reported and exit."""
    with render.reported(as_json):
        raw = client.asked(request)
        typed = client.typed(reply, request.SUBJECT, raw)
    if as_json:
        render.emit_json(raw)
    return typed


def ask(model: type[Command], as_json: bool, **values: Any) -> dict[str, Any]:
    """`model` built from the command line's values (`build`) and asked; its reply object as
    the service sent it, once it validated as the model's reply (printed as is with --json).
    Errors are reported and exit."""
    request = build(model, as_json, **values)
    with render.reported(as_json):
        reply = client.checked(request)
    if as_json:
        render.emit_json(reply)
    return reply


def call(subject: str, body: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """Send a request on `subject` with a JSON body; with --json print the reply as is.
    Errors are reported and exit. (`answer` is the typed way, from a request model.)"""
    with render.reported(as_json):
        reply = client.request(subject, json.dumps(body).encode())
    if as_json:
        render.emit_json(reply)
    return reply
