"""A worker's way through its steps (steps/base.py): their setups in the order its runtime
declares, then its launch, as one task per worker; once it has ended, their teardowns in
reverse, in this one place and in a task of its own, before its end is reported
(services/node-agent/README.md, "The step pipeline").

Done-markers: after a step's setup, if the step keeps one (`marked`), a line `<step>` (or
`<step>\\t<what it made>`) is appended to the worker's `steps` file (no fsync: like every
state file, it carries a worker across an agent restart, not a machine's). An agent that
restarts before the worker was launched runs only the steps without a marker, then launches
it; one that restarts after runs none (the worker is its runtime's then).

A worker's setups start at once, inside `start`, and go on as a task only from the first
step that waits on something (a pull, a build, a disk, a thread): a worker whose steps have
nothing to wait for (a bare process's) is launched before `start` returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Generator
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from ..steps.base import WorkerFailed
from .files import write_json_atomic
from .workdir import LAUNCHED

if TYPE_CHECKING:
    from ..runtimes.port import WorkerRuntime
    from .workdir import Worker

log = logging.getLogger("gpufleet.node_agent.workers")

MARKERS = "steps"


class Pipeline:
    def __init__(self, clock: Callable[[], datetime], news: Callable[[], None]) -> None:
        self.clock = clock
        self.news = news  # the manager's wake: a worker launched, or failed before it
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, w: Worker, rt: WorkerRuntime, *, resumed: bool = False) -> None:
        """Set `w` up and launch it (or record why not: exit.json); `resumed`: an agent
        restarted before it was launched, the steps with a done-marker are not run again."""
        w.setting_up = True
        rest = _eagerly(self._ready(w, rt, resumed))
        if rest is not None:
            self._tasks.add(rest)
            rest.add_done_callback(self._tasks.discard)

    async def _ready(self, w: Worker, rt: WorkerRuntime, resumed: bool) -> None:
        markers: IO[str] | None = None
        try:
            done = self._done(w) if resumed else set()
            for step in rt.steps:
                if step.name in done:
                    continue
                if w.stop_asked:
                    self._stopped(w)
                    return
                await step.setup(w)
                w.done_at[step.name] = self.clock()
                if step.marked:
                    if markers is None:
                        markers = w.file(MARKERS).open("a", buffering=1)
                    made = w.made.get(step.name)
                    markers.write(f"{step.name}\t{made}\n" if made else f"{step.name}\n")
            if w.stop_asked:
                self._stopped(w)
                return
            await rt.launch(w)
            w.done_at[LAUNCHED] = self.clock()
            log.info(
                "started worker %s (placement %s, GPUs %s, runtime %s)",
                w.key,
                w.placement_id,
                list(w.spec.gpu_indices),
                rt.name,
            )
            if w.stop_asked:  # while it was being launched
                rt.request_stop(w)
        except WorkerFailed as exc:
            self._failed(w, exc.reason)
        except Exception as exc:  # a step's own bug, or the host failing it: said, not hidden
            log.exception("worker %s: setting up failed", w.key)
            self._failed(w, f"cannot set the worker up: {exc}")
        finally:
            if markers is not None:
                markers.close()
            w.setting_up = False
            self.news()

    def _done(self, w: Worker) -> set[str]:
        """The steps with a done-marker; what they made back on the worker."""
        try:
            lines = w.file(MARKERS).read_text().splitlines()
        except OSError:
            return set()
        done = set()
        for line in lines:
            name, _, made = line.partition("\t")
            done.add(name)
            if made:
                w.made[name] = made
        return done

    def _end(self, w: Worker, fields: dict[str, Any]) -> None:
        write_json_atomic(
            w.file("exit.json"), {"exit_code": None, "ended_at": self.clock().isoformat(), **fields}
        )

    def _failed(self, w: Worker, reason: str) -> None:
        self._end(w, {"error": reason})
        log.warning("worker %s not started: %s", w.key, reason)

    def _stopped(self, w: Worker) -> None:
        self._end(w, {"stopped": True})

    def tear_down(self, w: Worker, rt: WorkerRuntime) -> asyncio.Task[None]:
        """`teardown` as the worker's own task (made once; news when it is over), so that a
        long one (its output's upload) never holds another worker's report."""
        if w.tearing is None:
            w.tearing = asyncio.ensure_future(self.teardown(w, rt))
            w.tearing.add_done_callback(lambda _: self.news())
        return w.tearing

    async def teardown(self, w: Worker, rt: WorkerRuntime) -> None:
        """`w` has ended (or never launched): its steps undone, last first. A teardown that
        fails is logged and the others still run: the worker's end is reported anyway."""
        for step in reversed(rt.steps):
            try:
                await step.teardown(w)
            except Exception:
                log.exception("worker %s: the %s step's teardown failed", w.key, step.name)
        w.torn_down = True


class _Rest:
    """The rest of a coroutine that `_eagerly` ran up to its first wait, as an awaitable: it
    hands that wait to the task that awaits it, then goes on as the coroutine would."""

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, None, None]:
        waiting = self.first
        while True:
            try:
                yield waiting
            except BaseException as exc:  # the task's cancellation, into the coroutine
                try:
                    waiting = self.coro.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                waiting = self.coro.send(None)
            except StopIteration:
                return


async def _finish(rest: _Rest) -> None:
    await rest


def _eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run `coro` now, up to its first wait on something, and the rest of it (if any) as a
    task: what Python 3.12's eager tasks do. None when it finished without waiting."""
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_finish(_Rest(coro, first)))
