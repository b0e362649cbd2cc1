"""`gpufleet node ...`: the account's nodes, as the provisioner knows them."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer
from gpufleet_contracts.base import Command
from gpufleet_contracts.identity import IssueJoinToken, JoinTokenIssued, RevokeNode
from gpufleet_contracts.nodes import (
    AddNode,
    ListNodes,
    NodeList,
    RemoveNode,
    SetMaintenance,
    ShowNode,
)
from gpufleet_contracts.verification import VerifyNode
from rich.markup import escape
from rich.table import Table

from . import render, views
from .common import JsonFlag, answer, ask, build

app = typer.Typer(help="Nodes and their GPUs.", no_args_is_help=True)

LIST_NODES = ListNodes.SUBJECT
SHOW_NODE = ShowNode.SUBJECT
SET_MAINTENANCE = SetMaintenance.SUBJECT


def _act(model: type[Command], as_json: bool, **values: Any) -> None:
    """Send a node request and show the node it answers with (a NodeView, or more)."""
    node = ask(model, as_json, **values)
    if not as_json:
        _show(node)


class Switch(StrEnum):
    on = "on"
    off = "off"


@app.command("list")
def list_(
    all_: Annotated[
        bool, typer.Option("--all", help="Removed nodes too (left out otherwise).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Your nodes: region, state, GPUs, simulated or real, last heartbeat."""
    reply = answer(build(ListNodes, as_json, include_removed=all_), NodeList, as_json)
    if not as_json:
        views.node_table([render.plain(n) for n in reply.nodes])
        for n in reply.nodes:
            if n.failed_rules:
                render.err().print(
                    f"[yellow]{escape(n.name)}[/] is out of service: "
                    + escape("; ".join(n.failed_rules))
                )


def _show(node: dict[str, Any]) -> None:
    table = Table("Field", "Value", title=f"node {node.get('name')}", title_justify="left")
    for key in ("minion_id", "region", "kind", "provider", "state", "simulated", "last_seen"):
        table.add_row(key, render.text(node.get(key)))
    table.add_row("gpus", escape(views.gpu_summary(node.get("gpus"))))
    # "nvml", a simulated inventory file, or why a node has no GPUs ("nvml: no NVIDIA driver").
    table.add_row("inventory", render.text(node.get("inventory_source")))
    if "sealing_key" in node:  # shown alone: what its workers' secrets are sealed to
        key = node["sealing_key"] or "none: its agent is too old for jobs with secrets"
        table.add_row("sealing key", render.text(key))
    hb = views.heartbeat(node.get("telemetry"))  # its last heartbeat
    for key, value in [] if hb is None else views.telemetry_rows(hb):
        table.add_row(key, escape(value))
    verification = node.get("verification")
    if isinstance(verification, dict):
        for key, value in _verification_rows(verification):
            table.add_row(key, render.text(value))
    if node.get("cloud"):
        c = node["cloud"]
        table.add_row(
            "cloud",
            render.text(f"{c.get('state')} in {c.get('zone')}, for worker {c.get('demand')}"),
        )
    render.out().print(table)
    for rule in node.get("failed_rules") or []:
        render.out().print(f"[red]failed[/] {escape(rule)}")
    if isinstance(verification, dict) and verification.get("checks"):
        render.out().print("GPU check:")
        for check in verification["checks"]:
            ok, _, what = str(check).partition(": ")
            mark = "[green]ok[/]    " if ok == "ok" else "[red]failed[/]"
            render.out().print(f"  {mark} {escape(what)}")
    for h in node.get("history") or []:
        render.out().print(f"  {h.get('state')}: {escape(str(h.get('reason')))}")


def _verification_rows(v: dict[str, Any]) -> list[tuple[str, str]]:
    """Verified nodes: whether it may take other accounts' jobs, or why not; when."""
    if v.get("verified"):
        verdict = "yes: its hardware passed gpufleet's GPU check (other accounts' jobs too)"
    else:
        verdict = f"no ({v.get('reason') or 'not checked yet'}): its owner's jobs only"
    rows = [("verified", verdict), ("checked", str(v.get("checked_at") or "never"))]
    pending = v.get("pending")
    if isinstance(pending, dict):
        rows.append(
            (
                "check",
                f"asked at {pending.get('sent_at')} ({pending.get('why')}), "
                f"answer due by {pending.get('deadline')}",
            )
        )
    elif v.get("next_check"):
        rows.append(("next check", str(v["next_check"])))
    return rows


@app.command("verify")
def verify(
    node: Annotated[str, typer.Argument(help="name or minion id")], as_json: JsonFlag = False
) -> None:
    """Ask the node for a GPU check now (verified nodes: only a node whose hardware passed
    it takes other accounts' jobs). `node show` tells the outcome."""
    _act(VerifyNode, as_json, node=node)


@app.command("add")
def add(
    region: Annotated[str, typer.Option(help="a physical region")],
    name: Annotated[str, typer.Option()],
    minion_id: Annotated[str, typer.Option("--minion-id", help="shown on the node's console")],
    kind: Annotated[str, typer.Option(help="compute | storage")] = "compute",
    upnp: Annotated[bool, typer.Option("--upnp/--no-upnp")] = True,
    mining: Annotated[bool, typer.Option("--mining/--no-mining")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Add a compute or storage node by its minion id (R-NODE-2/3)."""
    _act(
        AddNode,
        as_json,
        region=region,
        name=name,
        minion_id=minion_id,
        kind=kind,
        upnp=upnp,
        mining=mining,
    )


@app.command("replace-storage")
def replace_storage(
    region: Annotated[str, typer.Option()],
    name: Annotated[str, typer.Option()],
    minion_id: Annotated[str, typer.Option("--minion-id")],
    as_json: JsonFlag = False,
) -> None:
    """Replace the region's storage node with a new one (R-NODE-3)."""
    _act(
        AddNode,
        as_json,
        region=region,
        name=name,
        minion_id=minion_id,
        kind="storage",
        replace=True,
    )


@app.command("show")
def show(
    node: Annotated[str, typer.Argument(help="name or minion id")], as_json: JsonFlag = False
) -> None:
    """One node: state, history, hardware check results."""
    _act(ShowNode, as_json, node=node)


@app.command("maintenance")
def maintenance(
    node: Annotated[str, typer.Argument(help="name or minion id")],
    wanted: Annotated[
        Switch,
        typer.Argument(
            metavar="on|off", help="on: active -> maintenance; off: maintenance -> active"
        ),
    ],
    as_json: JsonFlag = False,
) -> None:
    """Put a node in maintenance (on) or back in service (off); only active nodes receive
    work. A node already in the state asked for is left as it is."""
    reply = ask(SetMaintenance, as_json, node=node, maintenance=wanted is Switch.on)
    if as_json:
        return
    if reply.get("changed") is False:
        state = str(reply.get("state"))
        where = "in maintenance" if state == "maintenance" else state
        render.err().print(
            f"{escape(str(reply.get('name')))} is already {escape(where)}: nothing changed"
        )
    _show(reply)


@app.command("remove")
def remove(
    node: Annotated[str, typer.Argument(help="name or minion id")], as_json: JsonFlag = False
) -> None:
    """Remove a node; its running workers are requeued."""
    _act(RemoveNode, as_json, node=node)


@app.command("token")
def token(
    minion_id: Annotated[str, typer.Argument(help="the node's minion id")],
    region: Annotated[str, typer.Option(help="the region the node joins")],
    ttl: Annotated[int, typer.Option(help="seconds the token stays valid")] = 24 * 3600,
    as_json: JsonFlag = False,
) -> None:
    """A one-time join token for one node (R-NODE-2): give it to the node's agent as
    GPUFLEET_JOIN_TOKEN; it is exchanged once for the node's own credential."""
    request = build(IssueJoinToken, as_json, minion_id=minion_id, region=region, ttl_s=ttl)
    reply = answer(request, JoinTokenIssued, as_json)
    if not as_json:
        render.err().print(
            f"join token for [bold]{escape(minion_id)}[/] in {escape(region)} "
            "(one use; treat it as a secret):"
        )
        render.out().print(reply.token, soft_wrap=True)


@app.command("revoke")
def revoke(
    node: Annotated[str, typer.Argument(help="name or minion id")], as_json: JsonFlag = False
) -> None:
    """Cut a node off at once: its credential is revoked and it is removed."""
    _act(RevokeNode, as_json, node=node)
