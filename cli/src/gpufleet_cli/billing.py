"""`gpufleet billing ...`: the account's balance, ledger, job costs and earnings (amounts as
Decimal strings, exact)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any

import typer
from gpufleet_contracts.billing import (
    Balance,
    Earnings,
    EarningsQuery,
    Entries,
    EntriesQuery,
    GetBalance,
    JobCost,
    JobCostQuery,
)
from rich.table import Table

from . import render, views
from .common import JsonFlag, answer, build

app = typer.Typer(
    help="Credits: balance, ledger entries, job costs, earnings.", no_args_is_help=True
)

BALANCE = GetBalance.SUBJECT
ENTRIES = EntriesQuery.SUBJECT
JOB_COST = JobCostQuery.SUBJECT
EARNINGS = EarningsQuery.SUBJECT


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
    reply = answer(GetBalance(), Balance, as_json)
    if as_json:
        return
    render.out().print(
        f"balance: {render.text(reply.balance)} credits ({render.text(reply.entries)} entries)"
    )
    if reply.earnings_unpaid_micro:
        render.out().print(f"earnings not paid out yet: {render.text(reply.earnings_unpaid)}")


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
    request = build(EntriesQuery, as_json, limit=limit, **_range(from_, to))
    reply = answer(request, Entries, as_json)
    if not as_json:
        views.entry_table([render.plain(e) for e in reply.entries])


@app.command("job-cost")
def job_cost(
    job_id: Annotated[str, typer.Argument(help="The job's id.")], as_json: JsonFlag = False
) -> None:
    """What one job cost the acting account, by kind of charge."""
    reply = answer(build(JobCostQuery, as_json, job_id=job_id), JobCost, as_json)
    if as_json:
        return
    table = Table("Kind", "Cost")
    for kind, v in reply.by_kind.items():
        table.add_row(render.text(kind), render.text(v.cost))
    table.add_row("[b]total[/b]", f"[b]{render.text(reply.cost)}[/b]")
    render.out().print(table)


@app.command()
def earnings(from_: FromOpt = None, to: ToOpt = None, as_json: JsonFlag = False) -> None:
    """Credits earned selling capacity (R-BILL-4), per node and per region, and paid out."""
    reply = answer(build(EarningsQuery, as_json, **_range(from_, to)), Earnings, as_json)
    if as_json:
        return
    table = Table("Region", "Node", "Earned")
    for row in reply.by_node:
        table.add_row(render.text(row.region), render.text(row.node_id), render.text(row.earned))
    render.out().print(table if reply.by_node else "no earnings in this range")
    for by_region in reply.by_region:
        render.out().print(
            f"region {render.text(by_region.region)}: {render.text(by_region.earned)}"
        )
    earned, paid = render.text(reply.earned), render.text(reply.paid_out)
    render.out().print(f"earned: {earned}, paid out: {paid}")
