"""One pass over the queue: who goes where, and why the rest wait. Pure: no I/O.

Order. Waiting workers are considered oldest job first (then worker number), R-JOB-8.

Backfill. A worker that cannot start does not block younger ones: they are placed wherever
they fit. Capacity only shrinks during a pass, so once a request *shape* (owner, types,
count, price, region, fraction, CPUs) has failed, later workers of the same shape fail at once
without another search.

Anti-starvation. Backfill alone can starve a large job forever: small jobs keep taking each
GPU as it frees. A worker that has waited longer than `starve_after_ms` gets a *hold* on the
node it is closest to fitting on (of the nodes it could use if they were free: the most
free GPUs/shares/CPUs, then the reference order): younger workers may not be placed there, so as
the work running on that node ends its GPUs accumulate until the old worker fits. Holds are
recomputed every pass (at most `max_holds`), so they follow the fleet; a held node still
takes the worker that holds it, and nothing running on it is disturbed.

Explanations. Every waiting worker's reason comes from its shape's explanation (each looks
at every candidate node: ~7 ms for ~2,400 nodes). A pass explains at most `explain_budget`
shapes: those never explained first, then those explained longest ago (`explained`, kept
by the caller from pass to pass), so with more shapes than the budget every shape is
explained again within a few passes, and a big backlog does not make every pass slow (256
shapes took ~2 s of each pass after a restart). A shape not explained in a pass keeps the
reason it had.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .index import PlacementIndex
from .placement import NodeView, NoPlacement, Placement, WorkerRequest, fit, rule_out


@dataclass(frozen=True)
class Waiting:
    req: WorkerRequest
    queued_ms: int

    @property
    def key(self) -> tuple[str, int]:
        return self.req.job_id, self.req.worker


@dataclass
class PassResult:
    placed: list[tuple[Waiting, Placement]] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    holds: dict[str, str] = field(default_factory=dict)  # node id -> job id
    reasons: dict[tuple[str, int], NoPlacement] = field(default_factory=dict)
    never_explained: int = 0  # shapes left without any explanation (over the budget)


def plan(
    waiting: list[Waiting],
    index: PlacementIndex,
    now_ms: int,
    *,
    starve_after_ms: int = 300_000,
    max_holds: int = 16,
    explain_budget: int = 256,
    on_place: Callable[[Placement], None] | None = None,
    explained: dict[tuple[object, ...], int] | None = None,
    pass_no: int = 0,
) -> PassResult:
    """Place what fits, oldest first. `index` is updated as workers are placed (through
    `on_place` when given, e.g. to claim exact GPU shares, else `index.take`)."""
    result = PassResult()
    failed: set[tuple[object, ...]] = set()
    memo: dict[tuple[object, ...], int] = {}
    for w in sorted(waiting, key=lambda w: (w.queued_ms, w.req.job_id, w.req.worker)):
        starving = now_ms - w.queued_ms >= starve_after_ms
        shape = w.req.shape()
        if shape in failed and not starving:
            result.waiting.append(w)
            continue
        decision = index.place(w.req, result.holds, memo)
        if decision is None:
            failed.add(shape)
            result.waiting.append(w)
            if starving and len(result.holds) < max_holds:
                node = _closest(w.req, index, result.holds)
                if node is not None:
                    result.holds[node.node_id] = w.req.job_id
            continue
        if on_place is not None:
            on_place(decision)
        else:
            index.take(decision)
        result.placed.append((w, decision))
    by_shape: dict[tuple[object, ...], list[Waiting]] = {}
    holders = set(result.holds.values())
    for w in result.waiting:  # oldest first, so shapes come in the order of their oldest job
        shape = (*w.req.shape(), w.req.job_id if w.req.job_id in holders else None)
        by_shape.setdefault(shape, []).append(w)
    last = explained if explained is not None else {}
    order = sorted(by_shape, key=lambda sh: last.get(sh, -1))  # stable: oldest job next
    result.never_explained = sum(1 for sh in order[explain_budget:] if sh not in last)
    for shape in order[:explain_budget]:
        ws = by_shape[shape]
        why = index.explain(ws[0].req, result.holds)
        for w in ws:
            result.reasons[w.key] = why
        last[shape] = pass_no
    if explained is not None:  # forget shapes nothing waits with any more
        for shape in [sh for sh in explained if sh not in by_shape]:
            del explained[shape]
    return result


def _closest(req: WorkerRequest, index: PlacementIndex, holds: dict[str, str]) -> NodeView | None:
    """The node `req` is closest to fitting on: one it could use were it free, not held."""
    best: tuple[tuple[object, ...], NodeView] | None = None
    for node_id in index.active_for(req):
        node = index.nodes[node_id]
        reason = rule_out(req, node, holds)
        if reason is None or not reason.startswith("busy"):
            continue
        if req.cpu_count:
            room = node.free_cpus
        elif req.fraction is not None:
            room = max((s for s, _ in node.share_slots()), default=0)
        else:
            room = len(node.free_indices)
        everything_free = replace(
            node, free_indices=node.gpu_indices, partial=(), free_cpus=node.cpus
        )
        key = (-room, *fit(req, everything_free)[0])
        if best is None or key < best[0]:
            best = (key, node)
    return None if best is None else best[1]
