"""`gpufleet provider ...`: enable the physical or Google Cloud provider (R-PROV-1/2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from gpufleet_contracts.providers import (
    EnableProvider,
    ListProviders,
    Providers,
    ProviderView,
    SetBurstPolicy,
)
from rich.table import Table

from . import client, render
from .common import JsonFlag, answer, ask

app = typer.Typer(help="Providers: physical (on-prem) and gcp.", no_args_is_help=True)


def show(obj: dict[str, Any], title: str) -> None:
    table = Table("Field", "Value", title=title, title_justify="left")
    for k, v in obj.items():
        table.add_row(k, render.text(json.dumps(v) if isinstance(v, dict | list) else v))
    render.out().print(table)


@app.command("enable")
def enable(
    provider: Annotated[str, typer.Argument(help="physical | gcp")],
    payment_mode: Annotated[
        str, typer.Option("--payment-mode", help="credits (stripe: coming soon)")
    ] = "credits",
    key_file: Annotated[
        Path | None,
        typer.Option(
            "--key-file",
            help="gcp: the service account's JSON key ('-' reads stdin). Sent to the "
            "provisioner, stored encrypted, never shown again.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Enable a provider for your account (once each)."""
    key_json: str | None = None
    if key_file is not None:
        try:
            key_json = sys.stdin.read() if str(key_file) == "-" else key_file.read_text()
        except OSError as exc:
            render.fail(
                client.CliError(f"cannot read {key_file}: {exc.strerror}", "invalid"), as_json
            )
    reply = ask(
        EnableProvider, as_json, provider=provider, payment_mode=payment_mode, key_json=key_json
    )
    if not as_json:
        show(reply, f"{provider} provider enabled")
        lifecycle = ProviderView.model_validate(reply).lifecycle
        if lifecycle is not None and lifecycle.writer_identity:
            render.out().print(
                f"Grant {lifecycle.writer_identity} roles/pubsub.publisher on "
                f"{lifecycle.topic} (the sink's writer identity)."
            )


@app.command("list")
def list_(as_json: JsonFlag = False) -> None:
    """Your providers (never their keys)."""
    reply = answer(ListProviders(), Providers, as_json)
    if not as_json:
        table = Table("Provider", "Payment", "Project", "Service account", "Enabled")
        for p in reply.providers:
            table.add_row(
                render.text(p.provider),
                render.text(p.payment_mode),
                render.text(p.gcp_project_id),
                render.text(p.client_email),
                render.when(p.enabled_at),
            )
        render.out().print(table)


@app.command("policy")
def policy(
    max_nodes: Annotated[int | None, typer.Option(help="cloud nodes alive at once")] = None,
    max_nodes_per_region: Annotated[int | None, typer.Option()] = None,
    max_new_per_pass: Annotated[int | None, typer.Option(help="instances asked at once")] = None,
    idle_s: Annotated[float | None, typer.Option(help="delete after idle this long")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Set the gcp burst policy (R-SCHED-3); unset options keep their value."""
    reply = ask(
        SetBurstPolicy,
        as_json,
        max_nodes=max_nodes,
        max_nodes_per_region=max_nodes_per_region,
        max_new_per_pass=max_new_per_pass,
        idle_s=idle_s,
    )
    if not as_json:
        show(reply, "burst policy")
