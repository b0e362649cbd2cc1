"""Small file helpers shared by the agent and the supervisor (kept free of heavy imports)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write `data` so that a reader sees the old file or the whole new one, never a part.

    Atomic, not durable: no fsync. These files carry a worker across a restart of the
    agent (the page cache outlives the process); a restart of the machine ends every
    worker with it, and an fsync per file cost a disk write for each of a job's four or
    five state files (issue 15; services/node-agent/README.md, "What a restart keeps")."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(data))  # one-shot: C; json.dump to a file is pure Python
    os.replace(tmp, path)


def write_secret_json(path: Path, data: dict[str, Any]) -> None:
    """A JSON file readable by this user alone (0600) from its creation on."""
    # Imported here: gpufleet_auth pulls in pydantic (~0.3 s of CPU), and the per-worker
    # supervisor, which imports this module, never writes a secret.
    from gpufleet_auth import write_secret

    write_secret(path, json.dumps(data))


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when the file is missing or not (yet) valid."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
