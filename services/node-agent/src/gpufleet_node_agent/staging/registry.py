"""The staging registries: a worker's data got onto the node before it runs and its output
off it after it ends, one fetcher or uploader per kind of location
(gpufleet_contracts.locations).

The inputs and outputs steps (steps/inputs.py, steps/outputs.py) ask these registries by
the type of a mount's source or of the output target. Both hold nothing yet: a job's
sources leave their directories empty and its output stays on the node, as before staging
existed (services/node-agent/README.md, "Staging"). A fetcher registered here is used at
once; asked for a kind it has no fetcher for, a registry fails the worker with a reason.
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
    """How far a transfer is: bytes done, of `total` when it is known."""

    done: int
    total: int | None = None


class Progress(Protocol):
    def __call__(self, moved: Moved) -> None: ...


class Fetcher(Protocol):
    """Puts what `source` names into the directory `dest` (made, empty or partly filled by
    an earlier try), saying how far it is; raises WorkerFailed with why it cannot."""

    async def __call__(self, source: Source, dest: Path, progress: Progress) -> None: ...


class Uploader(Protocol):
    """Puts the file or directory `path` where `target` says, saying how far it is; raises
    WorkerFailed with why it cannot."""

    async def __call__(self, path: Path, target: OutputTarget, progress: Progress) -> None: ...


@dataclass(frozen=True)
class Fetchers:
    """The fetchers of this node, by the `kind` of the source they take."""

    by_kind: Mapping[str, Fetcher] = field(default_factory=dict)

    def takes(self, source: Source) -> bool:
        return source.kind in self.by_kind

    async def fetch(self, source: Source, dest: Path, progress: Progress) -> None:
        fetcher = self.by_kind.get(source.kind)
        if fetcher is None:
            raise WorkerFailed(f"this node cannot fetch {source.kind} sources")
        await fetcher(source, dest, progress)


@dataclass(frozen=True)
class Uploaders:
    """The uploaders of this node, by the `kind` of the target they take."""

    by_kind: Mapping[str, Uploader] = field(default_factory=dict)

    def takes(self, target: OutputTarget) -> bool:
        return target.kind in self.by_kind

    async def put(self, path: Path, target: OutputTarget, progress: Progress) -> None:
        uploader = self.by_kind.get(target.kind)
        if uploader is None:
            raise WorkerFailed(f"this node cannot upload to {target.kind} targets")
        await uploader(path, target, progress)
