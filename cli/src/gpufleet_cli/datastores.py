"""`gpufleet datastore ...`: regional NFS/SMB datastores (R-RES-1, R-RES-2). An SMB password
is read from stdin (`--password-stdin`), never from the command line, and never shown."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from gpufleet_contracts.datastores import (
    AddDatastore,
    GetDatastore,
    ListDatastores,
    RemoveDatastore,
)
from rich.table import Table

from . import render
from .common import JsonFlag, call
from .provider import show

app = typer.Typer(help="Regional NFS/SMB datastores (team plans).", no_args_is_help=True)

RegionOption = Annotated[str, typer.Option("--region", help="one of your regions")]


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="unique in its region")],
    region: RegionOption,
    type_: Annotated[str, typer.Option("--type", help="nfs | smb")],
    address: Annotated[str, typer.Option(help="the server's host name or IP address")],
    root_path: Annotated[str, typer.Option(help="NFS: the export; SMB: /share or /share/dir")],
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="a mount option (repeatable)")
    ] = None,
    username: Annotated[str | None, typer.Option(help="SMB only")] = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="SMB only: read the password from stdin")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Add a datastore to one of your regions."""
    body: dict[str, object] = {
        "region": region,
        "name": name,
        "type": type_,
        "address": address,
        "root_path": root_path,
        "mount_options": option or [],
        "username": username,
    }
    if password_stdin:
        body["password"] = sys.stdin.readline().rstrip("\r\n")
    reply = call(AddDatastore.SUBJECT, body, as_json)
    if not as_json:
        show(reply, f"datastore {name} added")


@app.command("list")
def list_(
    region: Annotated[str | None, typer.Option("--region", help="only this region")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Your datastores."""
    reply = call(ListDatastores.SUBJECT, {"region": region} if region else {}, as_json)
    if not as_json:
        table = Table("Region", "Name", "Type", "Address", "Root", "Options", "User")
        for d in reply.get("datastores") or []:
            table.add_row(
                render.text(d.get("region")),
                render.text(d.get("name")),
                render.text(d.get("type")),
                render.text(d.get("address")),
                render.text(d.get("root_path")),
                render.text(",".join(d.get("mount_options") or []) or "-"),
                render.text(d.get("username") or "-"),
            )
        render.out().print(table)


@app.command("show")
def show_(name: str, region: RegionOption, as_json: JsonFlag = False) -> None:
    """One datastore (never its password: only whether it has one)."""
    reply = call(GetDatastore.SUBJECT, {"region": region, "name": name}, as_json)
    if not as_json:
        show(reply, f"datastore {name}")


@app.command("remove")
def remove(name: str, region: RegionOption, as_json: JsonFlag = False) -> None:
    """Remove a datastore."""
    reply = call(RemoveDatastore.SUBJECT, {"region": region, "name": name}, as_json)
    if not as_json:
        show(reply, f"datastore {name} removed")
