"""`gpufleet billing ...`: the account's balance, ledger, job costs and earnings (amounts as
Decimal strings, exact)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any

import typer
from gpufleet_contracts import subjects
from rich.table import Table

from . import render, views
from .common import JsonFlag, call

app = typer.Typer(
    help="Credits: balance, ledger entries, job costs, earnings.", no_args_is_help=True
)

BALANCE = subjects.rpc("billing", "balance")
ENTRIES = subjects.rpc("billing", "entries")
JOB_COST = subjects.rpc("billing", "job_cost")
EARNINGS = subjects.rpc("billing", "earnings")


def _iso(value: str | None, flag: str) -> str | None:
    if value is None:
        return None
    try:
        (datetime if "T" in value or " " in value else date).fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(
            f"{value!r} is not an ISO date (2025-06-01) or date-time", param_hint=flag
        ) from exc
    return value


FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from", metavar="DATE", help="From this ISO date or date-time (UTC), inclusive."
    ),
]
ToOpt = Annotated[
    str | None,
    typer.Option("--to", metavar="DATE", help="Up to this ISO date or date-time (UTC), exclusive."),
]


def _range(from_: str | None, to: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if _iso(from_, "--from"):
        body["from"] = from_
    if _iso(to, "--to"):
        body["to"] = to
    return body


@app.command()
def balance(as_json: JsonFlag = False) -> None:
    """The acting account's balance (negative: credits spent) and its unpaid earnings."""
    reply = call(BALANCE, {}, as_json)
    if as_json:
        return
    render.out().print(
        f"balance: {render.text(reply.get('balance'))} credits "
        f"({render.text(reply.get('entries'))} entries)"
    )
    if reply.get("earnings_unpaid_micro"):
        render.out().print(
            f"earnings not paid out yet: {render.text(reply.get('earnings_unpaid'))}"
        )


@app.command()
def entries(
    limit: Annotated[
        int,
        typer.Option(
            "--limit", metavar="N", min=1, max=1000, help="At most N entries, newest first."
        ),
    ] = 50,
    from_: FromOpt = None,
    to: ToOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The ledger entries of the acting account (and of its earnings sub-account)."""
    body = {"limit": limit, **_range(from_, to)}
    reply = call(ENTRIES, body, as_json)
    if not as_json:
        views.entry_table([e for e in reply.get("entries") or [] if isinstance(e, dict)])


@app.command("job-cost")
def job_cost(
    job_id: Annotated[str, typer.Argument(help="The job's id.")], as_json: JsonFlag = False
) -> None:
    """What one job cost the acting account, by kind of charge."""
    reply = call(JOB_COST, {"job_id": job_id}, as_json)
    if as_json:
        return
    table = Table("Kind", "Cost")
    for kind, v in (reply.get("by_kind") or {}).items():
        table.add_row(render.text(kind), render.text(v.get("cost") if isinstance(v, dict) else v))
    table.add_row("[b]total[/b]", f"[b]{render.text(reply.get('cost'))}[/b]")
    render.out().print(table)


@app.command()
def earnings(from_: FromOpt = None, to: ToOpt = None, as_json: JsonFlag = False) -> None:
    """Credits earned selling capacity (R-BILL-4), per node and per region, and paid out."""
    reply = call(EARNINGS, _range(from_, to), as_json)
    if as_json:
        return
    table = Table("Region", "Node", "Earned")
    for row in reply.get("by_node") or []:
        if isinstance(row, dict):
            table.add_row(
                render.text(row.get("region")),
                render.text(row.get("node_id")),
                render.text(row.get("earned")),
            )
    render.out().print(table if reply.get("by_node") else "no earnings in this range")
    for row in reply.get("by_region") or []:
        if isinstance(row, dict):
            render.out().print(
                f"region {render.text(row.get('region'))}: {render.text(row.get('earned'))}"
            )
    earned, paid = render.text(reply.get("earned")), render.text(reply.get("paid_out"))
    render.out().print(f"earned: {earned}, paid out: {paid}")
