"""Output shared by every command: JSON to stdout, errors to stderr, small formatters."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .client import CliError, ServiceError


def out() -> Console:
    """Console on stdout (made per call: the test runner swaps sys.stdout)."""
    return Console(highlight=False)


def err() -> Console:
    return Console(stderr=True, highlight=False)


def emit_json(obj: Any) -> None:
    """Print one JSON object to stdout, and nothing else."""
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def plain(reply: BaseModel) -> dict[str, Any]:
    """A reply model as the JSON object its service sent (what the tables read)."""
    dumped: dict[str, Any] = reply.model_dump(mode="json", by_alias=True)
    return dumped


def field_table(fields: list[dict[str, Any]], hints: Mapping[str, str] | None = None) -> Table:
    """Field / Rule / Problem / Valid, one row per refused field."""
    table = Table("Field", "Rule", "Problem", "Valid", title_justify="left")
    for f in fields:
        name = str(f.get("field", ""))
        hint = (hints or {}).get(name.removeprefix("spec.").split(".")[0])
        label = f"{name} ({hint})" if hint else name
        table.add_row(
            escape(label),
            escape(str(f.get("rule") or "")),
            escape(str(f.get("message") or "")),
            escape(str(f.get("valid") or "")),
        )
    return table


def report(exc: CliError, hints: Mapping[str, str] | None = None) -> None:
    """Describe an error on stderr."""
    console = err()
    console.print(f"[bold red]error[/] ({escape(exc.code)}): {escape(exc.message)}")
    if isinstance(exc, ServiceError) and exc.fields:
        console.print(field_table(exc.fields, hints))


def fail(exc: CliError, as_json: bool, hints: Mapping[str, str] | None = None) -> NoReturn:
    """Report `exc` (and print its ErrorReply with --json), then exit 1, or 2 if invalid."""
    if as_json:
        emit_json(exc.reply())
    report(exc, hints)
    raise typer.Exit(exc.exit_code)


@contextmanager
def reported(as_json: bool, hints: Mapping[str, str] | None = None) -> Iterator[None]:
    """Turn a CliError raised inside the block into output and an exit status."""
    try:
        yield
    except CliError as exc:
        fail(exc, as_json, hints)


# --- formatters ---------------------------------------------------------------------


def when(iso: str | None, short: bool = False) -> str:
    """An ISO time as local 'YYYY-MM-DD HH:MM:SS', '-' when missing. `short` (a narrow
    table): 'HH:MM:SS' today, 'MM-DD HH:MM' earlier this year, 'YYYY-MM-DD' before."""
    if not iso:
        return "-"
    try:
        t = datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    t = t.astimezone()
    if not short:
        return t.strftime("%Y-%m-%d %H:%M:%S")
    today = datetime.now(t.tzinfo).date()
    if t.date() == today:
        return t.strftime("%H:%M:%S")
    return t.strftime("%m-%d %H:%M" if t.year == today.year else "%Y-%m-%d")


def duration(seconds: float | None) -> str:
    """1h 02m 03s / 4m 05s / 6s / 0.031s; '-' when unknown."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h {m:02d}m {s:02d}s"
    return f"{m}m {s:02d}s" if m else f"{s}s"


def text(value: Any) -> str:
    """A value for a table cell (escaped: service data is never rich markup)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return escape(", ".join(str(v) for v in value))
    return escape(str(value))


def cpu_only(job: Mapping[str, Any]) -> bool:
    """A CPU-only job (R-JOB-2): its spec asks for no GPU, or its workers hold CPUs."""
    spec = job.get("spec")
    if isinstance(spec, Mapping) and (spec.get("gpu_count") == 0 or spec.get("cpu_count")):
        return True
    workers = job.get("workers")
    return isinstance(workers, list) and any(
        isinstance(w, Mapping) and w.get("cpu_count") for w in workers
    )


def state(value: Any, cpu: bool = False) -> str:
    """A job/node state, with `queued` shown the way users know it (`cpu`: a CPU-only job's,
    which waits for CPUs)."""
    s = str(value or "-")
    label = f"waiting for {'CPUs' if cpu else 'GPUs'}" if s == "queued" else s
    color = {
        "running": "green",
        "finished": "green",
        "active": "green",
        "ok": "green",
        "failed": "red",
        "lost": "red",
        "down": "red",
        "stopped": "yellow",
        "queued": "yellow",
        "starting": "cyan",
        "stopping": "cyan",
        "uploading": "cyan",
    }.get(s)
    return f"[{color}]{escape(label)}[/]" if color else escape(label)
