"""The `gpufleet` command: wires the command groups into one typer app."""

from __future__ import annotations

import typer
from gpufleet_contracts.locations import PlatformAsset

from . import (
    alerts,
    billing,
    console,
    datastores,
    devices,
    endpoints,
    identity,
    jobs,
    keys,
    nodes,
    ops,
    platform,
    projects,
    provider,
    region,
    reservations,
)

app = typer.Typer(
    name="gpufleet",
    help=(
        "Control a gpufleet GPU fleet: jobs, nodes, credits.\n\n"
        "Talks to the services over NATS as the identity of `gpufleet login --creds FILE` "
        "(the current context). Environment overrides: GPUFLEET_NATS_URL (default "
        "nats://127.0.0.1:4333, comma-separated for a cluster), GPUFLEET_NATS_CREDS (a .creds "
        "file), GPUFLEET_NATS_CA (TLS), GPUFLEET_ACCOUNT (operators only: the account to act "
        "for), GPUFLEET_REQUEST_TIMEOUT_S (default 10).\n\n"
        "Every command takes --json (the service's JSON object on stdout). "
        "Exit status: 0 ok, 1 service or connection error, 2 invalid input."
    ),
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(jobs.app, name="job")
app.add_typer(projects.app, name="project")
app.add_typer(keys.app, name="key")
app.add_typer(endpoints.app, name="endpoint")
for _asset in PlatformAsset:
    app.add_typer(platform.asset_app(_asset), name=_asset.value)
app.add_typer(nodes.app, name="node")
app.add_typer(devices.app, name="device")
app.add_typer(alerts.app, name="alert")
app.add_typer(provider.app, name="provider")
app.add_typer(region.app, name="region")
app.add_typer(datastores.app, name="datastore")
app.add_typer(reservations.app, name="reservation")
app.add_typer(billing.app, name="billing")
app.add_typer(console.app, name="console")
app.add_typer(ops.dlq_app, name="dlq")
app.command()(ops.health)
app.command()(identity.login)
app.add_typer(identity.context_app, name="context")
app.add_typer(identity.admin_app, name="admin")


if __name__ == "__main__":
    app()
