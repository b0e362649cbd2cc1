"""Operations: `gpufleet health` and `gpufleet dlq list`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from gpufleet_contracts import subjects

from . import client, render, views
from .client import CliError, StreamRecord

SERVICES = ("scheduler", "provisioner", "billing", "device-fleet", "datastore")
HEALTH = {svc: subjects.rpc(svc, "health") for svc in SERVICES}
HEALTH_TIMEOUT_S = 2.0

dlq_app = typer.Typer(help="Dead letters: messages a service refused.", no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print only a JSON object on stdout.")]


def _row(service: str, result: dict[str, Any] | CliError) -> dict[str, Any]:
    if isinstance(result, CliError):
        why = "no answer" if result.code == "unavailable" else result.message
        return {"service": service, "status": "down", "error": why}
    return {**result, "service": result.get("service", service)}


def health(as_json: JsonFlag = False) -> None:
    """Ask every service for its health (2 s each); exit 1 if any is down."""
    with render.reported(as_json):
        results = client.request_many(
            [(HEALTH[svc], b"{}") for svc in SERVICES], timeout=HEALTH_TIMEOUT_S
        )
    rows = [_row(svc, r) for svc, r in zip(SERVICES, results, strict=True)]
    healthy = all(r.get("status") == "ok" for r in rows)
    if as_json:
        render.emit_json({"ok": healthy, "services": rows})
    else:
        views.health_table(rows)
    if not healthy:
        raise typer.Exit(1)


def _dead_letter(record: StreamRecord) -> dict[str, Any]:
    try:
        body = json.loads(record.data)
    except ValueError:
        body = {"payload": record.data.decode("utf-8", "replace")}
    if not isinstance(body, dict):
        body = {"payload": body}
    return {"seq": record.seq, **body}


@dlq_app.command("list")
def dlq_list(
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, max=10000, help="The last N dead letters.")
    ] = 50,
    as_json: JsonFlag = False,
) -> None:
    """The dead letters kept for inspection (stream GPUFLEET_DLQ), oldest first."""
    with render.reported(as_json):
        try:
            records = client.read_stream(subjects.STREAM_DLQ, f"{subjects.DLQ}.>", last=limit)
        except CliError as exc:
            if exc.code != "not_found":
                raise
            records = []
    letters = [_dead_letter(r) for r in records][-limit:]
    if as_json:
        render.emit_json({"dead_letters": letters})
    else:
        views.dlq_table(letters)
