"""Who you are: `gpufleet login`, `gpufleet context ...` and the operators' `gpufleet admin ...`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from gpufleet_auth import Creds, write_secret
from gpufleet_contracts.identity import (
    AddUser,
    AdminIssueJoinToken,
    CreateAccount,
    ListAccounts,
    RemoveAccount,
    RevokeUser,
    SetPlan,
)
from gpufleet_contracts.verification import AdminVerifyNode
from rich.markup import escape
from rich.table import Table

from . import client, render
from . import settings as settings_mod
from .common import JsonFlag, ask, build

context_app = typer.Typer(help="Saved identities (credential + server), like `nats context`.")
admin_app = typer.Typer(help="Operators only: accounts, plans, users, join tokens.")
account_app = typer.Typer(help="Accounts and their plans (R-TEN-1, R-TEN-3).")
user_app = typer.Typer(help="Users of an account and their credentials.")
admin_app.add_typer(account_app, name="account")
admin_app.add_typer(user_app, name="user")


def _who(creds: Creds) -> str:
    account = creds.tag("account")
    user = creds.tag("user")
    if creds.kind == "operator":
        return "an operator"
    return f"user {user} of account {account}" if account else str(creds.kind)


def login(
    creds: Annotated[Path, typer.Option("--creds", help="a .creds file from your operator")],
    url: Annotated[str | None, typer.Option(help="NATS server(s)")] = None,
    name: Annotated[str, typer.Option("--context", help="name of this context")] = "default",
    as_json: JsonFlag = False,
) -> None:
    """Keep a credential as the current context (copied, 0600) and check that it works."""
    cfg = settings_mod.load()
    with render.reported(as_json):
        try:
            parsed = Creds.read(creds)
        except (OSError, ValueError) as exc:
            raise client.CliError(f"{creds}: {exc}", "invalid") from exc
        ctx = settings_mod.save_context(cfg, name, url or cfg.url, parsed)
        client.run(lambda s: s.nc.flush())  # connects with it: refused if the server says no
    result = {"context": ctx.name, "url": ctx.url, "identity": _who(parsed)}
    if as_json:
        render.emit_json(result)
    else:
        render.out().print(
            f"logged in as {escape(_who(parsed))} at {escape(ctx.url)} (context {ctx.name!r})"
        )


@context_app.command("list")
def context_list(as_json: JsonFlag = False) -> None:
    cfg = settings_mod.load()
    current = settings_mod.current_name(cfg)
    rows = [
        {
            "context": c.name,
            "url": c.url,
            "identity": _who(Creds.read(c.creds)),
            "current": c.name == current,
        }
        for c in settings_mod.list_contexts(cfg)
    ]
    if as_json:
        render.emit_json({"contexts": rows})
        return
    table = Table("", "Context", "URL", "Identity")
    for r in rows:
        table.add_row(
            "*" if r["current"] else "", str(r["context"]), str(r["url"]), str(r["identity"])
        )
    render.out().print(table)


@context_app.command("use")
def context_use(name: Annotated[str, typer.Argument()]) -> None:
    cfg = settings_mod.load()
    with render.reported(False):
        if settings_mod.read_context(cfg, name) is None:
            raise client.CliError(f"no context {name!r} (gpufleet context list)", "not_found")
        settings_mod.use_context(cfg, name)
    render.out().print(f"context {name!r} is current")


@context_app.command("show")
def context_show(as_json: JsonFlag = False) -> None:
    """The identity commands use now (environment first, then the current context)."""
    cfg = settings_mod.load()
    path = cfg.creds
    parsed = Creds.read(path) if path and path.exists() else None
    result = {
        "context": settings_mod.current_name(cfg),
        "url": cfg.url,
        "creds": str(path) if path else None,
        "identity": _who(parsed) if parsed else None,
        "account": cfg.acting_account(),
    }
    if as_json:
        render.emit_json(result)
    else:
        for k, v in result.items():
            render.out().print(f"{k}: {escape(str(v))}")


@account_app.command("create")
def account_create(
    account: Annotated[str, typer.Argument()],
    plan: Annotated[str, typer.Option(help="free | team | enterprise")] = "free",
    as_json: JsonFlag = False,
) -> None:
    reply = ask(CreateAccount, as_json, account=account, plan=plan)
    if not as_json:
        render.out().print(f"account {escape(account)} created on plan {reply.get('plan')}")


@account_app.command("plan")
def account_plan(
    account: Annotated[str, typer.Argument()],
    plan: Annotated[str, typer.Argument(help="free | team | enterprise")],
    as_json: JsonFlag = False,
) -> None:
    reply = ask(SetPlan, as_json, account=account, plan=plan)
    if not as_json:
        render.out().print(f"account {escape(account)} is on plan {reply.get('plan')}")


@account_app.command("remove")
def account_remove(
    account: Annotated[str, typer.Argument()],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove an account that holds no node: its users' and console credentials are revoked
    at once, and its name is never given out again (refused while it has nodes)."""
    if not yes:
        typer.confirm(f"remove account {account} and revoke all its credentials?", abort=True)
    reply = ask(RemoveAccount, as_json, account=account)
    if not as_json:
        users = ", ".join(reply.get("users") or []) or "none"
        render.out().print(f"account {escape(account)} removed (users revoked: {escape(users)})")


@account_app.command("list")
def account_list(as_json: JsonFlag = False) -> None:
    reply = ask(ListAccounts, as_json)
    if not as_json:
        table = Table("Account", "Plan", "Users")
        for a in reply.get("accounts") or []:
            table.add_row(str(a["account"]), str(a["plan"]), ", ".join(a.get("users") or []))
        render.out().print(table)


@user_app.command("add")
def user_add(
    account: Annotated[str, typer.Argument()],
    user: Annotated[str, typer.Argument()],
    out: Annotated[Path, typer.Option("--out", help="where to write the .creds file")],
    as_json: JsonFlag = False,
) -> None:
    """A user's credential, written once to --out (0600); give it to the user for `login`."""
    reply = ask(AddUser, False, account=account, user=user)
    Creds.parse(str(reply["creds"])).write(out)
    result = {"account": account, "user": user, "creds": str(out)}
    if as_json:
        render.emit_json(result)
    else:
        render.out().print(f"credential of {escape(user)} ({escape(account)}) written to {out}")


@user_app.command("revoke")
def user_revoke(
    account: Annotated[str, typer.Argument()],
    user: Annotated[str, typer.Argument()],
    as_json: JsonFlag = False,
) -> None:
    """Revoke a user's credential at once: its connections are closed, it cannot reconnect."""
    ask(RevokeUser, as_json, account=account, user=user)
    if not as_json:
        render.out().print(f"user {escape(user)} of {escape(account)} revoked")


@admin_app.command("node-token")
def node_token(
    account: Annotated[str, typer.Option(help="the account that will own the node")],
    minion_id: Annotated[str, typer.Argument()],
    region: Annotated[str, typer.Option()],
    ttl: Annotated[int, typer.Option()] = 24 * 3600,
    out: Annotated[Path | None, typer.Option("--out", help="write it to this file (0600)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """A join token for a node of any account (with --out, written there and not shown)."""
    body = {"account": account, "minion_id": minion_id, "region": region, "ttl_s": ttl}
    if out is None:
        reply = ask(AdminIssueJoinToken, as_json, **body)
        if not as_json:
            render.out().print(str(reply.get("token")), soft_wrap=True)
        return
    request = build(AdminIssueJoinToken, as_json, **body)
    with render.reported(as_json):  # errors as --json asks; the token itself is not shown
        reply = client.checked(request)
    write_secret(out, str(reply.get("token")) + "\n")
    if as_json:
        render.emit_json({"minion_id": minion_id, "written_to": str(out)})
    else:
        render.out().print(f"join token of {escape(minion_id)} written to {out}")


@admin_app.command("node-verify")
def node_verify(
    account: Annotated[str, typer.Option(help="the account that owns the node")],
    node: Annotated[str, typer.Argument(help="name or minion id")],
    as_json: JsonFlag = False,
) -> None:
    """Ask a node of any account for a GPU check now (verified nodes)."""
    reply = ask(AdminVerifyNode, as_json, account=account, node=node)
    if not as_json:
        pending = (reply.get("verification") or {}).get("pending") or {}
        render.out().print(
            f"GPU check asked of {escape(str(reply.get('name')))}; "
            f"answer due by {escape(str(pending.get('deadline')))}"
        )


__all__ = ["account_app", "admin_app", "context_app", "json", "login", "user_app"]
