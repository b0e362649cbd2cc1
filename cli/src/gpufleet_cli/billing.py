"""`gpufleet billing ...`: the account's balance and ledger (amounts as Decimal strings)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from gpufleet_contracts import subjects

from . import client, render, views

app = typer.Typer(help="Credits: balance and ledger entries.", no_args_is_help=True)

BALANCE = subjects.rpc("billing", "balance")
ENTRIES = subjects.rpc("billing", "entries")

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print only the service's JSON object on stdout.")
]


@app.command()
def balance(as_json: JsonFlag = False) -> None:
    """The acting account's balance (negative: credits spent)."""
    with render.reported(as_json):
        reply = client.request(BALANCE, b"{}")
    if as_json:
        render.emit_json(reply)
        return
    render.out().print(
        f"balance: {render.text(reply.get('balance'))} credits "
        f"({render.text(reply.get('entries'))} entries)"
    )


@app.command()
def entries(
    limit: Annotated[
        int,
        typer.Option(
            "--limit", metavar="N", min=1, max=1000, help="At most N entries, newest first."
        ),
    ] = 50,
    as_json: JsonFlag = False,
) -> None:
    """The latest ledger entries of the acting account."""
    with render.reported(as_json):
        reply = client.request(ENTRIES, json.dumps({"limit": limit}).encode())
    if as_json:
        render.emit_json(reply)
    else:
        views.entry_table([e for e in reply.get("entries") or [] if isinstance(e, dict)])
