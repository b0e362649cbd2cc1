"""Transactions of several processes on one database, one at a time, where the database
cannot isolate them (the embedded nx-27017; docs/nx-27017-gaps.md).

nx-27017 runs every session of a database on one SQLite connection, a transaction being a
savepoint: two transactions that overlap, from one process or two, release or roll back
each other's writes ("no such savepoint", a transaction half-applied). A process already
runs its own one at a time (`store._tx_lock`); with `GPUFLEET_MONGO_TX_LOCK_DIR` set (the
dev stack sets it beside nx-27017's data), each transaction also holds an exclusive
`flock` on `<dir>/<database>.lock`, so two scheduler processes (a leader and a standby)
take turns. The lock is the kernel's: a process that dies holding it lets it go. Left
unset against MongoDB, which isolates transactions itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

FIRST_WAIT_S = 0.001
LONGEST_WAIT_S = 0.02


def lock_path(lock_dir: Path, db_name: str) -> Path:
    return Path(lock_dir) / f"{db_name}.lock"


def _open(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:  # the directory, made once rather than asked for each time
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(path, flags, 0o600)


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.asynccontextmanager
async def held(lock_dir: Path, db_name: str) -> AsyncIterator[None]:
    """Hold the database's lock across processes; waiting for it does not block the event
    loop and can be cancelled. Each hold opens the file anew: `flock` belongs to an open
    file, so two holds in one process (two event loops) exclude each other too."""
    fd = _open(lock_path(lock_dir, db_name))
    try:
        wait = FIRST_WAIT_S
        while not _try(fd):
            await asyncio.sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT_S)
        yield
    finally:
        os.close(fd)  # closing the last descriptor of the open file releases the lock


@contextlib.contextmanager
def held_blocking(lock_dir: Path, db_name: str) -> Iterator[None]:
    """The same lock for a synchronous caller (a test pausing a process between its
    transactions, a maintenance script)."""
    fd = _open(lock_path(lock_dir, db_name))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
