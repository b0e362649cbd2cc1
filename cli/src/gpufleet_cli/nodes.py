"""`gpufleet node ...`: the account's nodes, as the provisioner knows them."""

from __future__ import annotations

from typing import Annotated

import typer
from gpufleet_contracts import subjects

from . import client, render, views

app = typer.Typer(help="Nodes and their GPUs.", no_args_is_help=True)

LIST_NODES = subjects.rpc("provisioner", "list_nodes")


@app.command("list")
def list_(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the service's JSON object on stdout.")
    ] = False,
) -> None:
    """Your nodes: region, state, GPUs, simulated or real, last heartbeat."""
    with render.reported(as_json):
        reply = client.request(LIST_NODES, b"{}")
    if as_json:
        render.emit_json(reply)
    else:
        views.node_table([n for n in reply.get("nodes") or [] if isinstance(n, dict)])
