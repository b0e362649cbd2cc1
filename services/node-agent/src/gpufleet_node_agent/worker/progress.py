"""How far a worker's staging is (its sources fetched, its output put): the progress the
fetchers and uploaders tell (staging/registry.py `Progress`) kept on the worker as
WorkerStaging's items, which the watch rounds report at most once a second (manager.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from gpufleet_contracts.jobs import Mount, StagingItem, StagingState
from gpufleet_contracts.locations import OutputTarget, Source

from ..staging.registry import Moved, Progress
from .workdir import Worker


def named(location: Source | OutputTarget) -> str:
    """What a location names, as a user may read it: a URL without its user, password,
    query string or fragment (a presigned URL's signature is in its query)."""
    url = getattr(location, "url", None)
    if isinstance(url, str):
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    datastore = getattr(location, "datastore", None)
    path = getattr(location, "path", None)
    if datastore is not None:
        return f"datastore {datastore}:{path}"
    if path is not None:
        return str(path)
    asset = getattr(location, "asset", None)
    name = getattr(location, "name", None)
    return f"platform {asset}" + (f" {name}" if name else "")


def track(w: Worker, item: StagingItem, clock: Callable[[], float] = time.monotonic) -> Progress:
    """`item` on the worker's staging (pending), and the Progress that moves it on."""
    w.staging[item.name] = item
    w.staging_seq += 1
    began = clock()

    def told(moved: Moved) -> None:
        elapsed = clock() - began
        done = moved.total is not None and moved.done >= moved.total
        state = StagingState.done if done else StagingState.fetching
        w.staging[item.name] = item.model_copy(
            update={
                "done": moved.done,
                "total": moved.total,
                "rate": int(moved.done / elapsed) if elapsed > 0 else 0,
                "state": StagingState.waiting if moved.waiting else state,
                "reason": moved.reason,
            }
        )
        w.staging_seq += 1

    return told


def ended(w: Worker, name: str, ok: bool) -> None:
    """The item `name` is over: done, or failed."""
    item = w.staging.get(name)
    if item is not None:
        state = StagingState.done if ok else StagingState.failed
        w.staging[name] = item.model_copy(update={"state": state})
        w.staging_seq += 1


def progress_for(w: Worker, mount: Mount) -> Progress:
    """The progress of the fetch of `mount`'s source (the inputs step's `progress_for`)."""
    source = mount.source
    item = StagingItem(
        name=mount.target,
        kind=source.kind if source is not None else "none",
        names=named(source) if source is not None else "",
    )
    return track(w, item)


def upload_progress(w: Worker, archive: str, target: OutputTarget) -> Progress:
    """The progress of the upload of the output archive `archive` to `target`."""
    item = StagingItem(name=archive, direction="upload", kind=target.kind, names=named(target))
    return track(w, item)
