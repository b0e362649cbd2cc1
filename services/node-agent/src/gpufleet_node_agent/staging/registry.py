"""The staging registries: a worker's data got onto the node before it runs and its output
off it after it ends, one fetcher or uploader per kind of location
(gpufleet_contracts.locations).

The inputs and outputs steps (steps/inputs.py, steps/outputs.py) ask these registries by
the type of a mount's source or of the output target (services/node-agent/README.md,
"Staging"). The node's own are built by node.py
from its settings; asked for a kind it has no fetcher for, a registry fails the worker with
a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpufleet_contracts.locations import OutputTarget, Source

from ..steps.base import WorkerFailed


@dataclass(frozen=True)
class Moved:
    """How far a transfer is: bytes done, of `total` when it is known; `waiting`: it has not
    begun, waiting for the user to send it (`local` data, `job connect`) or, with a `reason`,
    for something else (a datastore that does not answer)."""

    done: int
    total: int | None = None
    waiting: bool = False
    reason: str | None = None  # what it waits for, when it is not the user


class Progress(Protocol):
    def __call__(self, moved: Moved) -> None: ...


# A worker's attached keys (R-JOB-7) as the staging reads them: {type: {field: value}}
# (`aws`: access_key_id, secret_access_key, ...; gpufleet_contracts.keys.KEY_KINDS).
Keys = Mapping[str, Mapping[str, str]]


@dataclass(frozen=True)
class Transfer:
    """What one transfer of a worker may use: its keys, the bytes it may write on the node
    (what is left of its disk, R-JOB-2: past it, WorkerFailed "too large"), and who hears
    how far it is. `worker_dir`: the worker's directory, for what a transfer keeps beside
    the data (git's staged.json) or reads of the worker's own files (its ssh key file).
    `writable`: the worker may write its inputs (a bare process): the node's content cache
    (cache.py) copies a hit for it instead of linking its read-only files. `job_id`,
    `placement_id`, `worker`: whose transfer it is, for the `platform` and `local` fetchers'
    and uploaders' requests to the scheduler (platform.py, local.py), and `mount` the target
    of the mount it fills (`local`'s); the others ignore them. `account`: who the job runs
    for, the label of the bytes it moved (tally.py)."""

    keys: Keys
    limit_bytes: int
    progress: Progress
    worker_dir: Path | None = None
    writable: bool = False
    job_id: str | None = None
    placement_id: str | None = None
    worker: int = 0
    mount: str | None = None
    account: str | None = None


class Fetcher(Protocol):
    """Puts what `source` names into the directory `dest` (made, empty or partly filled by
    an earlier try), saying how far it is; raises WorkerFailed with why it cannot."""

    async def __call__(self, source: Source, dest: Path, t: Transfer) -> None: ...


class Uploader(Protocol):
    """Puts the file `path` where `target` says (a directory target: under it, by the
    file's name), saying how far it is, and reads back its size and checksum; raises
    WorkerFailed with why it cannot."""

    async def __call__(self, path: Path, target: OutputTarget, t: Transfer) -> None: ...


@dataclass(frozen=True)
class Fetchers:
    """The fetchers of this node, by the `kind` of the source they take."""

    by_kind: Mapping[str, Fetcher] = field(default_factory=dict)

    def takes(self, source: Source) -> bool:
        return source.kind in self.by_kind

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        fetcher = self.by_kind.get(source.kind)
        if fetcher is None:
            raise WorkerFailed(f"this node cannot fetch {source.kind} sources")
        await fetcher(source, dest, t)


@dataclass(frozen=True)
class Uploaders:
    """The uploaders of this node, by the `kind` of the target they take."""

    by_kind: Mapping[str, Uploader] = field(default_factory=dict)

    def takes(self, target: OutputTarget) -> bool:
        return target.kind in self.by_kind

    async def put(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        uploader = self.by_kind.get(target.kind)
        if uploader is None:
            raise WorkerFailed(f"this node cannot upload to {target.kind} targets")
        await uploader(path, target, t)
