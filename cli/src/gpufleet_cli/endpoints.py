"""`gpufleet endpoint key create|list|revoke`: the API keys of your endpoints (R-JOB-6).

A caller of an endpoint's URL sends `Authorization: Bearer <key>`. A key is shown once,
when it is created (the scheduler keeps only a digest of it): `key create` prints it alone
on stdout, so that `KEY=$(gpufleet endpoint key create JOB)` keeps it, and says on stderr
that it is not shown again.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from gpufleet_contracts.serving import CreateEndpointKey, ListEndpointKeys, RevokeEndpointKey
from rich.markup import escape
from rich.table import Table

from . import render
from .common import JsonFlag, ask

app = typer.Typer(help="Endpoints: the API keys that open their URLs.", no_args_is_help=True)
key_app = typer.Typer(
    help=(
        "API keys of your endpoint jobs: a caller sends `Authorization: Bearer <key>` to the "
        "job's URL (`gpufleet job open JOB`). A key is shown once, when created."
    ),
    no_args_is_help=True,
)
app.add_typer(key_app, name="key")

JobId = Annotated[str, typer.Argument(metavar="JOB", help="The endpoint job's id.")]


def _label(key: dict[str, Any]) -> str:
    name = key.get("name")
    return f"{escape(str(key.get('key_id')))}" + (f" ({escape(str(name))})" if name else "")


@key_app.command("create")
def create(
    job_id: JobId,
    name: Annotated[
        str | None,
        typer.Option("--name", metavar="NAME", help="A name to tell the key by (1..64 chars)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """A new key of endpoint JOB, printed once: store it now."""
    reply = ask(CreateEndpointKey, as_json, job_id=job_id, name=name)
    if as_json:
        return
    view = reply.get("view") if isinstance(reply.get("view"), dict) else {}
    sys.stdout.write(f"{reply.get('key')}\n")  # alone and whole, for `KEY=$(...)`
    sys.stdout.flush()
    render.err().print(
        f"created key {_label(view or {})} of endpoint {escape(job_id)}: "
        "[bold]store it now, it is not shown again[/] (send it as "
        '"Authorization: Bearer <key>")'
    )


@key_app.command("list")
def list_(job_id: JobId, as_json: JsonFlag = False) -> None:
    """The keys of endpoint JOB, revoked ones too; never a key itself."""
    reply = ask(ListEndpointKeys, as_json, job_id=job_id)
    if as_json:
        return
    keys = [k for k in reply.get("keys") or [] if isinstance(k, dict)]
    if not keys:
        render.out().print(f"endpoint {escape(job_id)} has no keys")
        return
    table = Table("Key id", "Name", "Created", "Revoked")
    for k in keys:
        table.add_row(
            escape(str(k.get("key_id"))),
            render.text(k.get("name")),
            render.when(k.get("created_at")),
            render.when(k.get("revoked_at")),
        )
    render.out().print(table)


@key_app.command("revoke")
def revoke(
    job_id: JobId,
    key_id: Annotated[
        str, typer.Argument(metavar="KEY_ID", help="The key's id (`endpoint key list`).")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Revoke a key of endpoint JOB: its callers get 401 within seconds. Idempotent."""
    reply = ask(RevokeEndpointKey, as_json, job_id=job_id, key_id=key_id)
    if not as_json:
        render.out().print(
            f"revoked key {_label(reply)} of endpoint {escape(job_id)} "
            f"({render.when(reply.get('revoked_at'))})"
        )


# --- `gpufleet job open JOB` ------------------------------------------------------------

# A sample JSON value of each body parameter type (R-JOB-6), for the example request.
SAMPLES: dict[str, Any] = {
    "string": "text",
    "integer": 1,
    "float": 1.5,
    "boolean": True,
    "object": {},
    "list": [],
}


def job_type(job: dict[str, Any]) -> str | None:
    """The job's type, as its spec in `job show` says it."""
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    value = (spec or {}).get("type")
    return None if value is None else str(value)


def no_url(job: dict[str, Any]) -> str:
    """Why a job has no URL (yet)."""
    kind = job_type(job)
    state = str(job.get("state"))
    name = job.get("id")
    if kind != "endpoint":
        return f"job {name} is a {kind} job: only endpoints and notebooks have a URL"
    if state in ("finished", "failed", "stopped"):
        return f"endpoint {name} has ended ({state}): its URL is closed"
    if any(isinstance(w, dict) and w.get("node") for w in job.get("workers") or []):
        return f"endpoint {name} runs on a node whose agent serves no URL (it has no proxy)"
    return (
        f"endpoint {name} is not running yet ({state}): it has a URL once a node takes it; "
        "try again in a moment (`gpufleet job show` says why it waits)"
    )


def example(job: dict[str, Any], url: str) -> str:
    """A request that reaches the endpoint: its first route with its required parameters,
    or its own server's root."""
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    endpoint = (spec or {}).get("endpoint") or {}
    routes = [r for r in endpoint.get("routes") or [] if isinstance(r, dict)]
    auth = 'curl -H "Authorization: Bearer $KEY"'
    if not routes:
        return f"{auth} {url.rstrip('/')}/"
    first = routes[0]
    body = {
        str(p.get("name")): SAMPLES.get(str(p.get("type")), "")
        for p in first.get("body") or []
        if isinstance(p, dict) and not p.get("optional")
    }
    payload = json.dumps(body)
    return f"{auth} -X POST {url.rstrip('/')}{first.get('path')} -d '{payload}'"
