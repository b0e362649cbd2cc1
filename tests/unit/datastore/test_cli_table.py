"""`gpufleet model list`'s table fits 80 columns, giving way in its own order."""

from __future__ import annotations

from gpufleet_cli.platform import objects_table, size
from rich.console import Console

OBJECT = {
    "account": "alice",
    "name": "a rather long model name made by a training job",
    "state": "ready",
    "size": 123456789,
    "sha256": "ab" * 32,
    "public": True,
    "job_id": "0f" * 16,
    "created_at": "2026-11-27T11:12:42+00:00",
}


def test_the_table_fits_80_columns() -> None:
    console = Console(width=80, record=True)
    console.print(objects_table([OBJECT, {**OBJECT, "name": "m", "size": None}], 80, True))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "alice" in lines[2] and "117.7 MiB" in lines[2]


def test_sizes_read_in_binary_units() -> None:
    assert (size(5), size(2048), size(None)) == ("5 B", "2.0 KiB", "-")
