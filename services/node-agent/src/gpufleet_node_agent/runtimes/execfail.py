"""A worker whose command could not be run at all, told apart from one that ran and failed:
`command not found: <name>` with the shell's exit status 127 (126: found, not executable),
whatever ran it, so that `job show` and `job logs` name the missing command.

A bare worker's command is looked up before its supervisor starts (`cannot_start`, as the
shell would find it on the node). A container's command is looked up inside the container,
by catatonit (its PID 1), whose exec of it fails with one line on the worker's log and exit
status 1; `not_executed` reads that line back from the log's end.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..worker.workdir import Worker

NOT_FOUND = 127
NOT_EXECUTABLE = 126
# catatonit's words when execvp(3) of the command fails (catatonit.c, `failed to exec pid1`).
_CATATONIT = re.compile(rb"ERROR \(catatonit:\d+\): failed to exec pid1: ([^\n]+)")
_TAIL_BYTES = 4096
_ENOENT = os.strerror(errno.ENOENT)  # "No such file or directory"


def failure(program: str, cause: str) -> dict[str, Any]:
    """exit.json's fields for `program` that could not be executed for `cause` (strerror)."""
    if cause == _ENOENT:
        return {"exit_code": NOT_FOUND, "reason": f"command not found: {program}"}
    return {
        "exit_code": NOT_EXECUTABLE,
        "reason": f"command cannot be executed: {program} ({cause})",
    }


def cannot_start(command: Sequence[str], env: Mapping[str, str]) -> dict[str, Any] | None:
    """Why a bare worker's command cannot be executed (as the shell would find it on this
    node), as exit.json's fields; None when it can."""
    program = command[0] if command else ""
    if not program:
        return {"exit_code": NOT_FOUND, "reason": "the command is empty"}
    if shutil.which(program, path=env.get("PATH", os.defpath)) is not None:
        return None
    if "/" in program and os.path.exists(program):
        return failure(program, os.strerror(errno.EACCES))
    return failure(program, _ENOENT)


def in_container(log: Path, command: Sequence[str]) -> dict[str, Any] | None:
    """exit.json's fields when the log of a container that exited 1 ends with catatonit's
    failed exec of `command`; None otherwise (the command ran and exited 1 itself)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    found = _CATATONIT.findall(tail)
    if not found:
        return None
    program = command[0] if command else "?"
    return failure(program, found[-1].decode(errors="replace").strip())


def note(log: Path, fields: Mapping[str, Any]) -> None:
    """Say it on the worker's log too, where `job logs` shows it."""
    with log.open("ab") as f:
        f.write(f"gpufleet: {fields['reason']} (exit status {fields['exit_code']})\n".encode())


def not_executed(w: Worker) -> dict[str, Any]:
    """For a container worker that exited 1: exit.json's fields (said on its log too) when
    its command was never executed; none when it ran."""
    fields = in_container(w.file("log"), w.spec.command)
    if fields is None:
        return {}
    note(w.file("log"), fields)
    return fields
