"""A worker's output kept within bounds: a job is untrusted, and what it prints lands on the
node's disk (the worker's `log`, outside its disk quota) and in the JetStream log stream.

The first `log_max_bytes` of a worker's output are kept and shipped (reports.py); beyond
them nothing more is shipped but one notice, and the node frees the blocks of what the job
goes on writing (a hole punched in the file, which the job keeps appending to), keeping
only the last TAIL_BYTES for the end's `log_tail`. So a worker that prints without end costs
the node at most about `log_max_bytes + TAIL_BYTES` of disk (plus what it writes between two
rounds), and the stream at most `log_max_bytes`: like the kubelet's cap on container logs,
without rotating (the job's file descriptor stays as it is).

podman's log (conmon's `container.log`, converted into `log` by the agent) is freed up to
what was converted (`freed`), and a backlog beyond BACKLOG_MAX that the agent could not
convert in time is skipped with a notice (podman.py).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .files import read_int, write_text_atomic

TAIL_BYTES = 64 * 1024  # kept at the end of a capped log (LOG_TAIL_CHARS read from it)
BACKLOG_MAX = 64 * 1024 * 1024  # podman: conmon's log not yet converted, at most
BLOCK = 4096
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def notice(max_bytes: int) -> bytes:
    return (
        f"\n[gpufleet: this worker's output passed {max_bytes} bytes; "
        "the rest is not kept (GPUFLEET_WORKER_LOG_MAX_BYTES)]\n"
    ).encode()


def punch(path: Path, start: int, end: int) -> bool:
    """Free the file's blocks in [start, end) (whole blocks inside it), its size unchanged:
    reads there give zeros. False when the filesystem cannot (the blocks stay)."""
    start = -(-start // BLOCK) * BLOCK
    end = end // BLOCK * BLOCK
    if end <= start:
        return True
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        flags = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        return bool(_libc.fallocate(fd, flags, start, end - start) == 0)
    finally:
        os.close(fd)


def freed(path: Path, upto: int, keep_from: int = 0) -> None:
    """Free `path` in [keep_from, upto) once, remembering how far (`<path>.freed`) so that
    a round frees only what is new; small steps wait for a larger one."""
    marker = path.with_name(path.name + ".freed")
    done = max(read_int(marker) or 0, keep_from)
    if upto - done < 16 * BLOCK:
        return
    if punch(path, done, upto):
        write_text_atomic(marker, str(upto // BLOCK * BLOCK))


def bound(path: Path, size: int, max_bytes: int) -> None:
    """A capped log: free what lies past the kept part, but its last TAIL_BYTES."""
    if size > max_bytes + TAIL_BYTES:
        freed(path, size - TAIL_BYTES, keep_from=max_bytes)
