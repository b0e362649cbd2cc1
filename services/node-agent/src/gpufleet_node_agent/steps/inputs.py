"""A worker's inputs (R-JOB-3, R-JOB-4): the directories its mount plan names made before it
runs, and what fills them fetched into them by the node's fetchers (staging/registry.py).

The node has no fetcher yet: a mount whose source no fetcher takes keeps its directory
empty, as before staging existed; once a fetcher is registered for a kind, its sources are
fetched (and one it fails on fails the worker). `strict` fails a worker whose sources some
fetcher cannot take instead: off until the staging wing fetches every kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..staging.registry import Fetchers, Moved
from ..worker.layout import mount_dir
from .base import StepName

if TYPE_CHECKING:
    from ..worker.workdir import Worker


def _unheard(moved: Moved) -> None:
    """Progress nobody shows yet."""


class InputsStep:
    """`dirs`: the directories the worker's runtime needs for its inputs (a bare worker:
    each mount's; a container: the read-only roots its binds show)."""

    name = StepName.inputs

    def __init__(
        self,
        dirs: Callable[[Worker], Iterable[Path]],
        fetchers: Fetchers | None = None,
        *,
        strict: bool = False,
    ) -> None:
        self.dirs = dirs
        self.fetchers = fetchers or Fetchers()
        self.strict = strict

    @property
    def marked(self) -> bool:
        """Only directories to make, without a fetcher: as cheap to make again."""
        return bool(self.fetchers.by_kind)

    async def setup(self, w: Worker) -> None:
        for d in self.dirs(w):
            d.mkdir(parents=True, exist_ok=True)
        for m in w.spec.mounts:
            if m.source is None:
                continue
            if self.strict or self.fetchers.takes(m.source):
                dest = mount_dir(w.dir, m.target)
                dest.mkdir(parents=True, exist_ok=True)
                await self.fetchers.fetch(m.source, dest, _unheard)

    async def teardown(self, w: Worker) -> None:
        """Nothing: what was fetched goes with the worker's directory."""
