"""`gpufleet key ...`: your account's attached third-party keys (R-JOB-7).

Values are never taken from the command line (they would stay in the shell's history and
in `ps`): `key add TYPE` prompts for each field without echo, or reads a JSON object of the
fields from a file (`--from-file FILE`, `-` for stdin). Nothing prints a value back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from gpufleet_contracts.keys import KEY_KINDS, AttachKey, ListKeys, RemoveKey
from rich.markup import escape
from rich.table import Table

from . import render
from .client import CliError
from .common import JsonFlag, ask

app = typer.Typer(
    help=(
        "Third-party keys of your account (docker, ngc, aws, huggingface, wandb, ...): "
        "attached once, used by every job that names the type in environment.keys. Registry "
        "keys (docker, ngc) pull the job's image; the others are given to its workers as "
        "files /run/secrets/<type>/<field>. Values are stored encrypted and never shown."
    ),
    no_args_is_help=True,
)

ATTACH = AttachKey.SUBJECT
LIST = ListKeys.SUBJECT
REMOVE = RemoveKey.SUBJECT
TYPES = ", ".join(KEY_KINDS)

KeyType = Annotated[str, typer.Argument(metavar="TYPE", help=f"The key's type: {TYPES}.")]


def _invalid(message: str, as_json: bool) -> NoReturn:
    render.fail(CliError(message, "invalid"), as_json)


def _from_file(path: str, as_json: bool) -> dict[str, str]:
    try:
        data = json.loads(sys.stdin.read() if path == "-" else Path(path).read_text())
    except (OSError, ValueError) as exc:  # never echo the content: it holds the values
        _invalid(f"--from-file {path}: not a readable JSON object ({type(exc).__name__})", as_json)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        _invalid(f"--from-file {path}: must be a JSON object of field names to strings", as_json)
    return {str(k): v for k, v in data.items()}


def _prompted(key_type: str, as_json: bool) -> dict[str, str]:
    kind = KEY_KINDS.get(key_type)
    if kind is None:
        _invalid(f"unknown key type {key_type}; valid: {TYPES}", as_json)
    values: dict[str, str] = {}
    for name in kind.required:
        values[name] = typer.prompt(f"{key_type} {name}", hide_input=True)
    for name in kind.optional:
        value = typer.prompt(f"{key_type} {name} (optional)", default="", hide_input=True)
        if value:
            values[name] = value
    return values


def _show(key: dict[str, Any], verb: str) -> None:
    render.out().print(
        f"{verb} [bold]{escape(str(key.get('type')))}[/] key "
        f"(fields {escape(', '.join(key.get('fields') or []))}; {key.get('fingerprint')})"
    )


@app.command("add")
def add(
    key_type: KeyType,
    from_file: Annotated[
        str | None,
        typer.Option(
            "--from-file",
            metavar="FILE",
            help='A JSON object of the key\'s fields (\'-\': stdin), e.g. {"token": "..."}. '
            "Without it, each field is prompted for (no echo).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Attach your TYPE key, or replace the one attached. Never takes a value as an argument."""
    values = (
        _from_file(from_file, as_json) if from_file is not None else _prompted(key_type, as_json)
    )
    reply = ask(AttachKey, as_json, type=key_type, secret=values)
    if not as_json:
        _show(reply, "attached")


@app.command("list")
def list_(as_json: JsonFlag = False) -> None:
    """Your attached keys: type, field names, fingerprint, when; never a value."""
    reply = ask(ListKeys, as_json)
    if as_json:
        return
    keys = [k for k in reply.get("keys") or [] if isinstance(k, dict)]
    if not keys:
        render.out().print("no keys attached")
        return
    table = Table("Type", "Fields", "Fingerprint", "Attached", "Updated")
    for k in keys:
        table.add_row(
            escape(str(k.get("type"))),
            escape(", ".join(k.get("fields") or [])),
            escape(str(k.get("fingerprint"))),
            render.when(k.get("created_at")),
            render.when(k.get("updated_at")),
        )
    render.out().print(table)


@app.command("remove")
def remove(key_type: KeyType, as_json: JsonFlag = False) -> None:
    """Remove your TYPE key. Queued jobs that name it fail when they would be placed."""
    reply = ask(RemoveKey, as_json, type=key_type)
    if not as_json:
        _show(reply, "removed")
