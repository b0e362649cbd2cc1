"""`gpufleet project ...`: your projects and who may submit jobs to them (R-TEN-1)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from gpufleet_contracts.projects import (
    AddProjectMember,
    CreateProject,
    ListProjects,
    RemoveProjectMember,
)
from rich.markup import escape
from rich.table import Table

from . import render
from .common import JsonFlag, ask

app = typer.Typer(
    help=(
        "Projects: every job belongs to one. A plain name is a project of yours (created on "
        "first use); members of a project submit to it as OWNER/NAME (federated jobs: the "
        "owner pays for the GPUs, the member the federated fee)."
    ),
    no_args_is_help=True,
)

CREATE = CreateProject.SUBJECT
ADD_MEMBER = AddProjectMember.SUBJECT
REMOVE_MEMBER = RemoveProjectMember.SUBJECT
LIST = ListProjects.SUBJECT

Project = Annotated[str, typer.Argument(metavar="PROJECT", help="The name of a project of yours.")]
Account = Annotated[str, typer.Argument(metavar="ACCOUNT", help="The member's account.")]


def _show(project: dict[str, Any]) -> None:
    members = project.get("members")
    who = ", ".join(escape(str(m)) for m in members) if members else "no members"
    render.out().print(f"project [bold]{escape(str(project.get('id')))}[/]: {who}")


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The new project's name.")],
    as_json: JsonFlag = False,
) -> None:
    """Create a project of yours (using a new name in `job submit --project` does too)."""
    reply = ask(CreateProject, as_json, name=name)
    if not as_json:
        _show(reply)


@app.command("list")
def list_(
    limit: Annotated[int, typer.Option(help="At most this many projects.")] = 100,
    as_json: JsonFlag = False,
) -> None:
    """The projects you own (with their members) and those you are a member of."""
    reply = ask(ListProjects, as_json, limit=limit)
    if as_json:
        return
    projects = [p for p in reply.get("projects") or [] if isinstance(p, dict)]
    if not projects:
        render.out().print("no projects yet")
        return
    table = Table("Project", "Owner", "Role", "Members", "Created")
    for p in projects:
        members = p.get("members")
        table.add_row(
            escape(str(p.get("id"))),
            escape(str(p.get("owner"))),
            str(p.get("role")),
            "-" if members is None else escape(", ".join(members)) or "none",
            render.when(p.get("created_at")),
        )
    render.out().print(table)


@app.command("add-member")
def add_member(project: Project, account: Account, as_json: JsonFlag = False) -> None:
    """Let ACCOUNT submit jobs to PROJECT (as YOUR_ACCOUNT/PROJECT)."""
    reply = ask(AddProjectMember, as_json, project=project, account=account)
    if not as_json:
        _show(reply)


@app.command("remove-member")
def remove_member(project: Project, account: Account, as_json: JsonFlag = False) -> None:
    """ACCOUNT may no longer submit to PROJECT; its jobs there stay."""
    reply = ask(RemoveProjectMember, as_json, project=project, account=account)
    if not as_json:
        _show(reply)
