"""`gpufleet reservation ...`: port reservations (R-RES-3), published with mDNS as
`<hostname>.local` by the node that runs the job attached to one."""

from __future__ import annotations

from typing import Annotated

import typer
from gpufleet_contracts.reservations import AddReservation, ListReservations, RemoveReservation
from rich.table import Table

from . import render
from .common import JsonFlag, call
from .provider import show

app = typer.Typer(help="Port reservations published with mDNS (team plans).", no_args_is_help=True)

RegionOption = Annotated[str, typer.Option("--region", help="one of your regions")]


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="unique in its region")],
    region: RegionOption,
    hostname: Annotated[str, typer.Option(help="published as <hostname>.local")],
    port: Annotated[int, typer.Option(help="1-65535")],
    as_json: JsonFlag = False,
) -> None:
    """Reserve a hostname and port in one of your regions."""
    body = {"region": region, "name": name, "type": "port", "hostname": hostname, "port": port}
    reply = call(AddReservation.SUBJECT, body, as_json)
    if not as_json:
        show(reply, f"reservation {name} added")


@app.command("list")
def list_(
    region: Annotated[str | None, typer.Option("--region", help="only this region")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Your port reservations."""
    reply = call(ListReservations.SUBJECT, {"region": region} if region else {}, as_json)
    if not as_json:
        table = Table("Region", "Name", "Hostname", "Port")
        for r in reply.get("reservations") or []:
            table.add_row(
                render.text(r.get("region")),
                render.text(r.get("name")),
                render.text(f"{r.get('hostname')}.local"),
                render.text(r.get("port")),
            )
        render.out().print(table)


@app.command("remove")
def remove(name: str, region: RegionOption, as_json: JsonFlag = False) -> None:
    """Remove a reservation."""
    reply = call(RemoveReservation.SUBJECT, {"region": region, "name": name}, as_json)
    if not as_json:
        show(reply, f"reservation {name} removed")
