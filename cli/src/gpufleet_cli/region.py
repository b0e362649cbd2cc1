"""`gpufleet region ...`: physical (R-REG-1) and GCP (R-REG-2/3) regions."""

from __future__ import annotations

from typing import Annotated

import typer
from gpufleet_contracts import subjects
from rich.table import Table

from . import render
from .common import JsonFlag, call
from .provider import show

app = typer.Typer(help="Regions of your providers.", no_args_is_help=True)

CREATE = subjects.rpc("provisioner", "create_region")
LIST = subjects.rpc("provisioner", "list_regions")
QUOTAS = subjects.rpc("provisioner", "region_quotas")


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="physical: a DNS host name; gcp: e.g. us-central1")],
    provider: Annotated[str, typer.Option(help="physical | gcp")] = "physical",
    storage_mode: Annotated[str, typer.Option(help="physical: local | central")] = "local",
    allow_public_jobs: Annotated[
        bool, typer.Option("--allow-public-jobs", help="physical: sell spare capacity")
    ] = False,
    storage_class: Annotated[str, typer.Option(help="gcp: standard | large")] = "standard",
    as_json: JsonFlag = False,
) -> None:
    """Create a region."""
    body = {
        "provider": provider,
        "name": name,
        "storage_mode": storage_mode,
        "allow_public_jobs": allow_public_jobs,
        "storage_class": storage_class,
    }
    reply = call(CREATE, body, as_json)
    if not as_json:
        show(reply, f"region {name} created")


@app.command("list")
def list_(as_json: JsonFlag = False) -> None:
    """Your regions."""
    reply = call(LIST, {}, as_json)
    if not as_json:
        table = Table("Name", "Provider", "Storage", "Public jobs", "Runnable jobs")
        for r in reply.get("regions") or []:
            runnable = r.get("runnable_jobs") or {}
            table.add_row(
                render.text(r.get("name")),
                render.text(r.get("provider")),
                render.text(r.get("storage_mode")),
                "yes" if r.get("allow_public_jobs") else "no",
                ", ".join(f"{k}: {v}" for k, v in runnable.items() if v) or "-",
            )
        render.out().print(table)


@app.command("quotas")
def quotas(
    name: Annotated[str, typer.Argument(help="a supported GCP region")],
    as_json: JsonFlag = False,
) -> None:
    """A GCP region's quotas (limit and usage) and runnable jobs per GPU type (R-REG-3)."""
    reply = call(QUOTAS, {"name": name}, as_json)
    if not as_json:
        table = Table("Quota", "Limit", "Usage", title=name, title_justify="left")
        for metric, q in sorted((reply.get("quotas") or {}).items()):
            table.add_row(metric, render.text(q.get("limit")), render.text(q.get("usage")))
        render.out().print(table)
        jobs = Table("GPU type", "Runnable jobs")
        for gpu, n in (reply.get("runnable_jobs") or {}).items():
            jobs.add_row(gpu, str(n))
        render.out().print(jobs)
