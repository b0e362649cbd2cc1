"""`gpufleet region ...`: physical (R-REG-1) and GCP (R-REG-2/3) regions."""

from __future__ import annotations

from typing import Annotated

import typer
from gpufleet_contracts.providers import (
    CreateRegion,
    ListRegions,
    RegionQuotas,
    Regions,
    ShowRegionQuotas,
)
from rich.table import Table

from . import render
from .common import JsonFlag, answer, ask, build
from .provider import show

app = typer.Typer(help="Regions of your providers.", no_args_is_help=True)


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
    reply = ask(
        CreateRegion,
        as_json,
        provider=provider,
        name=name,
        storage_mode=storage_mode,
        allow_public_jobs=allow_public_jobs,
        storage_class=storage_class,
    )
    if not as_json:
        show(reply, f"region {name} created")


@app.command("list")
def list_(as_json: JsonFlag = False) -> None:
    """Your regions."""
    reply = answer(ListRegions(), Regions, as_json)
    if not as_json:
        table = Table("Name", "Provider", "Storage", "Public jobs", "Runnable jobs")
        for r in reply.regions:
            runnable = r.runnable_jobs or {}
            table.add_row(
                render.text(r.name),
                render.text(r.provider),
                render.text(r.storage_mode),
                "yes" if r.allow_public_jobs else "no",
                ", ".join(f"{k}: {v}" for k, v in runnable.items() if v) or "-",
            )
        render.out().print(table)


@app.command("quotas")
def quotas(
    name: Annotated[str, typer.Argument(help="a supported GCP region")],
    as_json: JsonFlag = False,
) -> None:
    """A GCP region's quotas (limit and usage) and runnable jobs per GPU type (R-REG-3)."""
    reply = answer(build(ShowRegionQuotas, as_json, name=name), RegionQuotas, as_json)
    if not as_json:
        table = Table("Quota", "Limit", "Usage", title=name, title_justify="left")
        for metric, q in sorted(reply.quotas.items()):
            table.add_row(metric, render.text(q.limit), render.text(q.usage))
        render.out().print(table)
        jobs = Table("GPU type", "Runnable jobs")
        for gpu, n in reply.runnable_jobs.items():
            jobs.add_row(gpu, str(n))
        render.out().print(jobs)
