"""`gpufleet dataset|model|checkpoint list|show|remove`: your account's platform objects
(R-JOB-3, R-JOB-4), made by jobs with a `platform` output and used by later jobs as their
datasets, model code or checkpoints. Another account's public object is `<owner>/<name>`."""

# No `from __future__ import annotations`: typer reads the commands' annotations, which name
# this module's per-asset closures' locals.
from typing import Annotated, Any

import typer
from gpufleet_contracts.locations import PlatformAsset
from gpufleet_contracts.platform import (
    GetPlatformObject,
    ListPlatformObjects,
    RemovePlatformObject,
)
from rich.markup import escape

from .common import JsonFlag, ask
from .render import out, text, when
from .views import Col, Step, fitted

STEPS: list[Step] = [
    ("drop", "Job"),
    ("short", "Created"),
    ("drop", "SHA-256"),
    ("cut", "Name"),
]


def size(value: Any) -> str:
    if not isinstance(value, int):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def objects_table(objects: list[dict[str, Any]], width: int, others: bool) -> Any:
    """The objects in a table at most `width` wide (80 columns: Job, then long times, then
    the checksum give way; names are cut last)."""
    cols = [
        *([Col("Account", [text(o.get("account")) for o in objects])] if others else []),
        Col("Name", [text(o.get("name")) for o in objects], floor=12),
        Col("State", [text(o.get("state")) for o in objects]),
        Col("Size", [size(o.get("size")) for o in objects], justify="right"),
        Col("Public", ["yes" if o.get("public") else "no" for o in objects]),
        Col("SHA-256", [escape(str(o.get("sha256") or "-")[:12]) for o in objects]),
        Col("Job", [text(o.get("job_id")) for o in objects]),
        Col(
            "Created",
            [when(o.get("created_at")) for o in objects],
            short=[when(o.get("created_at"), short=True) for o in objects],
        ),
    ]
    return fitted(cols, STEPS, width)


def asset_app(asset: PlatformAsset) -> typer.Typer:
    kind = asset.value
    app = typer.Typer(
        help=(
            f"Your account's {kind}s: made by a job with output type platform/{kind}, used by "
            f"later jobs by name. Another account's public {kind} is <owner>/<name>."
        ),
        no_args_is_help=True,
    )
    Name = Annotated[
        str, typer.Argument(metavar="NAME", help=f"The {kind}'s name (<owner>/<name>: public).")
    ]

    @app.command("list")
    def list_(
        public: Annotated[
            bool, typer.Option("--public", help=f"Every account's public {kind}s instead.")
        ] = False,
        limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
        as_json: JsonFlag = False,
    ) -> None:
        """Your {kind}s (or the public ones), newest first."""
        reply = ask(ListPlatformObjects, as_json, asset=kind, public=public, limit=limit)
        if as_json:
            return
        found = [o for o in reply.get("objects") or [] if isinstance(o, dict)]
        console = out()
        if not found:
            console.print(f"no {kind}s")
            return
        console.print(objects_table(found, console.width, public))

    @app.command("show")
    def show(name: Name, as_json: JsonFlag = False) -> None:
        """One {kind}: its state, size, checksum and the job that made it."""
        reply = ask(GetPlatformObject, as_json, asset=kind, name=name)
        if as_json:
            return
        console = out()
        for label, value in (
            ("account", text(reply.get("account"))),
            ("name", text(reply.get("name"))),
            ("state", text(reply.get("state"))),
            ("size", size(reply.get("size"))),
            ("sha256", text(reply.get("sha256"))),
            ("public", "yes" if reply.get("public") else "no"),
            ("job", text(reply.get("job_id"))),
            ("created", when(reply.get("created_at"))),
            ("ready", when(reply.get("ready_at"))),
        ):
            console.print(f"[bold]{label:<8}[/] {value}")

    @app.command("remove")
    def remove(name: Name, as_json: JsonFlag = False) -> None:
        """Remove your {kind} and its bytes. Queued jobs that name it fail when they stage it."""
        reply = ask(RemovePlatformObject, as_json, asset=kind, name=name)
        if not as_json:
            out().print(f"removed {kind} [bold]{text(reply.get('name'))}[/]")

    for command in (list_, show, remove):
        command.__doc__ = (command.__doc__ or "").format(kind=kind)
    return app
