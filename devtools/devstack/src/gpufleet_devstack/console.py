"""What `just up` prints: rich when it is importable (it comes with the CLI), plain print
otherwise; paths shown relative to the current directory."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Out(Protocol):
    def step(self, text: str) -> None: ...
    def ok(self, text: str) -> None: ...
    def warn(self, text: str) -> None: ...
    def error(self, text: str) -> None: ...
    def plain(self, text: str) -> None: ...
    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None: ...


class PlainOut:
    def step(self, text: str) -> None:
        print(f"==> {text}", flush=True)

    def ok(self, text: str) -> None:
        print(f"ok  {text}", flush=True)

    def warn(self, text: str) -> None:
        print(f"!!  {text}", flush=True)

    def error(self, text: str) -> None:
        print(f"error: {text}", flush=True)

    def plain(self, text: str) -> None:
        print(text, flush=True)

    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
        print(title)
        for row in (headers, *rows):
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
        sys.stdout.flush()


class RichOut:
    def __init__(self) -> None:
        from rich.console import Console

        # soft_wrap: long lines (commands to copy) are not broken at the terminal width
        self._console = Console(highlight=False, soft_wrap=True)

    def step(self, text: str) -> None:
        self._console.print(f"[bold blue]==>[/] {_esc(text)}")

    def ok(self, text: str) -> None:
        self._console.print(f"[green]ok [/] {_esc(text)}")

    def warn(self, text: str) -> None:
        self._console.print(f"[yellow]!! [/] {_esc(text)}")

    def error(self, text: str) -> None:
        self._console.print(f"[bold red]error:[/] {_esc(text)}")

    def plain(self, text: str) -> None:
        self._console.print(_esc(text))

    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in rows:
            styled = [_esc(c) for c in row]
            if row and len(row) > 1:
                colour = "green" if row[1].startswith("up") else "red"
                styled[1] = f"[{colour}]{styled[1]}[/]"
            table.add_row(*styled)
        self._console.print(table)


def _esc(text: str) -> str:
    try:
        from rich.markup import escape
    except ImportError:  # pragma: no cover
        return text
    return escape(text)


def make_out() -> Out:
    """rich when it is importable (it comes with the CLI), plain print otherwise."""
    try:
        return RichOut()
    except ImportError:
        return PlainOut()


def rel(path: Path) -> str:
    """`path` relative to cwd when it is below it (shorter to read and to copy)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
