"""Operations: `gpufleet health` and `gpufleet dlq list`."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from gpufleet_contracts import subjects
from gpufleet_contracts.deadletters import VERB as DEAD_LETTERS
from gpufleet_contracts.deadletters import ListDeadLetters
from rich.markup import escape

from . import client, render, views
from .client import CliError

SERVICES = ("scheduler", "provisioner", "billing", "device-fleet", "datastore")
HEALTH = {svc: subjects.rpc(svc, "health") for svc in SERVICES}
HEALTH_TIMEOUT_S = 2.0
DEAD_LETTERS_TIMEOUT_S = 10.0

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


def merge_dead_letters(replies: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The services' records, newest first (one stream: its sequence orders them all)."""
    records = [r for reply in replies for r in reply.get("dead_letters") or []]
    records = [r for r in records if isinstance(r, dict)]
    records.sort(key=lambda r: int(r.get("seq") or 0), reverse=True)
    return records[:limit]


@dlq_app.command("list")
def dlq_list(
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, max=1000, help="The last N dead letters.")
    ] = 50,
    all_accounts: Annotated[
        bool,
        typer.Option("--all-accounts", help="Every account's dead letters (operators only)."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """The messages the services refused for your account, newest first; exit 1 if a
    service did not answer (what the others kept is still shown)."""
    payload = ListDeadLetters(limit=limit).to_bytes()
    with render.reported(as_json):
        if all_accounts:  # the operators' verb: every account's
            asked = [subjects.admin(svc, DEAD_LETTERS) for svc in SERVICES]
        else:  # the acting account's own
            asked = [client.addressed(subjects.rpc(svc, DEAD_LETTERS)) for svc in SERVICES]
        results = client.request_many(
            [(subject, payload) for subject in asked],
            timeout=DEAD_LETTERS_TIMEOUT_S,
            ce_type=ListDeadLetters.TYPE,
        )
        failed = [
            (svc, r) for svc, r in zip(SERVICES, results, strict=True) if isinstance(r, CliError)
        ]
        if len(failed) == len(SERVICES):
            raise failed[0][1]
    letters = merge_dead_letters([r for r in results if not isinstance(r, CliError)], limit)
    if as_json:
        render.emit_json({"dead_letters": letters})
    else:
        views.dlq_table(letters)
    for svc, exc in failed:
        render.err().print(f"[yellow]warning[/]: {svc}: {escape(exc.message)}")
    if failed:
        raise typer.Exit(1)
