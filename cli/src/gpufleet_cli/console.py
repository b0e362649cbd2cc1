"""`gpufleet console login`: a one-time link that signs you in to the web console as yourself.

The provisioner mints a short-lived credential of yours (a user's of your account, or an
operator's) and keeps it under a one-time code; the console gateway redeems the code and acts
for you on that credential (gateway/README.md: how, and its threat model).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from gpufleet_auth import Creds
from gpufleet_contracts.console import (
    SESSION_TTL_S,
    AdminOpenConsoleSession,
    ConsoleCode,
    OpenConsoleSession,
)

from . import client, render
from . import settings as settings_mod
from .common import JsonFlag, build

DEFAULT_URL = "http://127.0.0.1:8470"

app = typer.Typer(help="The web console: sign in with a one-time link.", no_args_is_help=True)


def _operator() -> bool:
    path = settings_mod.load().creds
    return path is not None and path.exists() and Creds.read(path).kind == "operator"


@app.command()
def login(
    url: Annotated[
        str, typer.Option(envvar="GPUFLEET_CONSOLE_URL", help="The console's address.")
    ] = DEFAULT_URL,
    hours: Annotated[
        float,
        typer.Option(min=0.1, max=SESSION_TTL_S / 3600, help="How long the session lasts."),
    ] = SESSION_TTL_S / 3600,
    as_json: JsonFlag = False,
) -> None:
    """Print a link (valid once, for two minutes) that signs this identity in to the console."""
    model = AdminOpenConsoleSession if _operator() else OpenConsoleSession
    request = build(model, as_json, ttl_s=max(60, int(hours * 3600)))
    with render.reported(as_json):
        code = client.ask(request, ConsoleCode)
    link = f"{url.rstrip('/')}/login?code={code.code}"
    if as_json:
        expiry = {"expires_at": code.expires_at, "session_expires_at": code.session_expires_at}
        render.emit_json({"url": link, **expiry})
        return
    until = datetime.fromtimestamp(code.session_expires_at, UTC)
    render.out().print(f"Open this link within two minutes (it works once):\n{link}")
    render.out().print(
        f"The session lasts until {until:%Y-%m-%d %H:%M} UTC, or until you sign out."
    )
