"""What the object-store fetchers share (s3.py, gcs.py, azure.py): a bucket URL split, the
names under a prefix as safe relative paths, and a file that counts what is written."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, TypeVar
from urllib.parse import urlsplit

from ..steps.base import WorkerFailed
from .archives import _inside
from .meter import Meter

T = TypeVar("T")
R = TypeVar("R")
ASKED_AT_ONCE = 16  # a prefix's objects asked for (versions) and fetched in parallel


async def in_thread(
    failed: Callable[[str, Exception], WorkerFailed],
    shown: str,
    fn: Callable[..., R],
    *args: object,
) -> R:
    """`fn(*args)` in a thread (a blocking client's call); what the client raised, but a
    WorkerFailed, said of `shown` by `failed` (not found, forbidden, ...)."""
    try:
        return await asyncio.to_thread(fn, *args)
    except WorkerFailed:
        raise
    except Exception as exc:
        raise failed(shown, exc) from None


def each(ask: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`ask` of each item, in order, ASKED_AT_ONCE at a time (the clients are threadsafe)."""
    if len(items) <= 1:
        return [ask(i) for i in items]
    with ThreadPoolExecutor(min(ASKED_AT_ONCE, len(items))) as pool:
        return list(pool.map(ask, items))


def digest(versions: Iterable[tuple[str, object]]) -> str:
    """One version of a prefix: its objects' names and versions."""
    text = json.dumps([[name, str(v)] for name, v in versions])
    return "prefix:" + hashlib.sha256(text.encode()).hexdigest()


def bucket_key(url: str) -> tuple[str, str]:
    """`s3://bucket/path/` -> (`bucket`, `path/`)."""
    parts = urlsplit(url)
    return parts.netloc, parts.path.lstrip("/")


def is_prefix(key: str) -> bool:
    """A path ending in `/` (or none at all) names everything under it: a directory."""
    return key == "" or key.endswith("/")


def relative(shown: str, prefix: str, key: str) -> str | None:
    """Where the object `key` under `prefix` goes in the directory; None for a directory
    marker. Refused when its name would leave the directory."""
    rel = key[len(prefix) :]
    if rel == "" or rel.endswith("/"):
        return None
    norm = _inside(rel)
    if norm is None:
        raise WorkerFailed(f"{shown}: object {key[:200]!r} escapes the directory")
    return norm


def part_file(dest: Path, name: str) -> Path:
    """Where one object is written before it is placed (archives.place): in `dest`."""
    return dest / f".gpufleet-{os.path.basename(name.rstrip('/')) or 'object'}.part"


def target_file(dest: Path, rel: str) -> Path:
    path = dest / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class Counted:
    """A file opened for writing whose bytes are counted by `meter` (past its limit: the
    write raises WorkerFailed "too large")."""

    def __init__(self, f: BinaryIO, meter: Meter) -> None:
        self.f = f
        self.meter = meter

    def write(self, data: bytes) -> int:
        self.meter.add(len(data))
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()
