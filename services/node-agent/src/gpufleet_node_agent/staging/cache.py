"""The node's content cache: what a source held at one version (an S3 ETag, a GCS
generation, an Azure ETag, an http ETag or Last-Modified and length) fetched once per node,
restaged into each worker that names it again (services/node-agent/README.md, "Cache").

A hit is given only after the source answered the version question to the worker's own
keys (`Versioned`): the cache never shows an account what it could not fetch itself. An
entry is `<root>/<key>/` (`data/` as the fetcher left it, read-only, and `meta.json`),
written under a `.tmp-` name and renamed when whole: a crash leaves only a `.tmp-` directory,
removed at the next start. Past the byte budget the least recently used entries go.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpufleet_contracts.locations import Source

from .meter import shown, too_large
from .registry import Fetcher, Moved, Transfer

log = logging.getLogger("gpufleet.node_agent.staging.cache")

TMP = ".tmp-"
META = "meta.json"
DATA = "data"
FILE_MODE = 0o444
DIR_MODE = 0o555


class Versioned(Protocol):
    """The version of what `source` holds now, asked with the worker's keys and without
    its bytes (a HEAD, a metadata call); None when the source cannot say (not cached).
    Raises WorkerFailed as the fetch would (forbidden, not found)."""

    async def __call__(self, source: Source, t: Transfer) -> str | None: ...


@dataclass
class Counts:
    hits: int = 0
    misses: int = 0
    fetched_bytes: int = 0  # what misses brought onto the node
    served_bytes: int = 0  # what hits restaged without a transfer
    evicted: int = 0


def _named(source: Source) -> str:
    """The source as a log line or a reason may name it (no password of a URL)."""
    return shown(str(getattr(source, "url", source.kind)))


def tree_size(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_size
    return total


def _sealed(d: Path) -> None:
    """Files 0444 and directories 0555: no worker (nor a slip of the agent's) writes them."""
    for root, dirs, files in os.walk(d, topdown=False):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, FILE_MODE)
        for name in dirs:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, DIR_MODE)
    os.chmod(d, DIR_MODE)


def _removed(d: Path) -> None:
    """A sealed tree removed (its directories made writable first)."""
    if not d.exists():
        return
    os.chmod(d, 0o755)
    for root, dirs, _ in os.walk(d):
        for name in dirs:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
    shutil.rmtree(d)


def restage(data: Path, dest: Path, *, link: bool) -> None:
    """The entry's tree put in `dest`: hard links (the files stay 0444, the agent's) or,
    for a worker that may write its inputs, copies of its own."""
    for root, dirs, files in os.walk(data):
        rel = os.path.relpath(root, data)
        out = dest if rel == "." else dest / rel
        for name in dirs:
            (out / name).mkdir(exist_ok=True)
        for name in files:
            src, dst = os.path.join(root, name), out / name
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            if link:
                try:
                    os.link(src, dst)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
            shutil.copyfile(src, dst)  # another filesystem (a quota image): copied


def _moved(src: Path, dest: Path) -> None:
    """What a fetch left in `src` put in `dest` (an entry larger than the budget)."""
    for child in src.iterdir():
        try:
            os.rename(child, dest / child.name)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            if child.is_dir():
                shutil.copytree(child, dest / child.name, symlinks=True)
            else:
                shutil.copyfile(child, dest / child.name)


class ContentCache:
    """`root`: <agent_state_dir>/staging-cache; `budget_bytes`: what its entries may hold."""

    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.counts = Counts()
        self._entries: OrderedDict[str, int] = OrderedDict()  # key -> size, oldest use first
        self._locks: dict[str, asyncio.Lock] = {}
        self._opened = False
        self._opening = asyncio.Lock()

    @property
    def held_bytes(self) -> int:
        return sum(self._entries.values())

    def entries(self) -> list[str]:
        self._open()
        return list(self._entries)

    def _open(self) -> None:
        """What an earlier run left: `.tmp-` trees removed, entries indexed by last use."""
        if self._opened:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        found: list[tuple[float, str, int]] = []
        for child in self.root.iterdir():
            if child.name.startswith(TMP):
                _removed(child)
                continue
            try:
                size = int(json.loads((child / META).read_text())["size"])
                found.append((child.stat().st_mtime, child.name, size))
            except (OSError, ValueError, KeyError, TypeError):
                _removed(child)  # not an entry this cache wrote whole
        for _, key, size in sorted(found):
            self._entries[key] = size
        self._opened = True

    def fetcher(self, fetch: Fetcher, version: Versioned) -> Fetcher:
        """`fetch` through the cache: the version asked first, with the worker's keys."""

        async def cached(source: Source, dest: Path, t: Transfer) -> None:
            await self.fetch(fetch, version, source, dest, t)

        return cached

    @staticmethod
    def key(source: Source, version: str) -> str:
        named = json.dumps([source.model_dump(mode="json"), version], sort_keys=True)
        return hashlib.sha256(named.encode()).hexdigest()

    async def fetch(
        self, fetch: Fetcher, version: Versioned, source: Source, dest: Path, t: Transfer
    ) -> None:
        now = await version(source, t)  # raises as the source refuses this worker's keys
        if now is None:
            await fetch(source, dest, t)
            return
        async with self._opening:
            if not self._opened:
                await asyncio.to_thread(self._open)
        key = self.key(source, now)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._entries:
                await self._miss(key, fetch, version, source, now, dest, t)
                return
            started = time.monotonic()
            size = await self._restaged(key, source, dest, t)
            self.counts.hits += 1
            self.counts.served_bytes += size
            log.info(
                "staging cache hit: %s (%d bytes restaged in %.0f ms, %s)",
                _named(source),
                size,
                (time.monotonic() - started) * 1000,
                "copied" if t.writable else "linked",
            )

    async def _restaged(self, key: str, source: Source, dest: Path, t: Transfer) -> int:
        size = self._entries[key]
        if size > t.limit_bytes:
            raise too_large(_named(source), t.limit_bytes)
        entry = self.root / key
        await asyncio.to_thread(restage, entry / DATA, dest, link=not t.writable)
        os.utime(entry)
        self._entries.move_to_end(key)
        t.progress(Moved(size, size))
        return size

    async def _miss(
        self,
        key: str,
        fetch: Fetcher,
        version: Versioned,
        source: Source,
        now: str,
        dest: Path,
        t: Transfer,
    ) -> None:
        self.counts.misses += 1
        tmp = self.root / f"{TMP}{key}-{uuid.uuid4().hex[:8]}"
        (tmp / DATA).mkdir(parents=True)
        try:
            await fetch(source, tmp / DATA, t)
            size = await asyncio.to_thread(tree_size, tmp / DATA)
            self.counts.fetched_bytes += size
            # changed while it came (or too large to keep): the worker's alone
            if size > self.budget_bytes or await version(source, t) != now:
                await asyncio.to_thread(_moved, tmp / DATA, dest)
                return
            meta = {"url": _named(source), "version": now, "size": size}
            (tmp / META).write_text(json.dumps(meta))
            await asyncio.to_thread(_sealed, tmp / DATA)
            os.rename(tmp, self.root / key)  # whole, or not at all
        finally:
            if tmp.exists():
                await asyncio.to_thread(_removed, tmp)
        self._entries[key] = size
        await self._evict()
        await self._restaged(key, source, dest, t)

    async def _evict(self) -> None:
        """The least recently used entries, while past the budget (the newest stays: it
        fits); an entry being restaged is left for the next time."""
        for key in list(self._entries)[:-1]:
            if self.held_bytes <= self.budget_bytes:
                return
            held = self._locks.get(key)
            if held is not None and held.locked():
                continue
            self._entries.pop(key)
            self._locks.pop(key, None)
            gone = self.root / f"{TMP}evicted-{key}"
            os.rename(self.root / key, gone)  # no hit finds it from here on
            await asyncio.to_thread(_removed, gone)
            self.counts.evicted += 1
            log.info("staging cache: evicted %s", key)
