"""What every command group shares: the --json option and one request-and-print step."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from . import client, render

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print only the service's JSON object on stdout.")
]


def call(subject: str, body: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """Send a request; with --json print the reply as is. Errors are reported and exit."""
    with render.reported(as_json):
        reply = client.request(subject, json.dumps(body).encode())
    if as_json:
        render.emit_json(reply)
    return reply
