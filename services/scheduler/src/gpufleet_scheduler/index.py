"""The fleet, indexed for placement: the same answers as `placement.place`, without a scan.

Active nodes with a catalogue GPU are kept in groups: for each (GPU model, owner, region)
the owner's nodes (they pay the usage fee of the model's class: one rate for the group),
and for each (GPU model, region) the real, verified nodes open to public jobs (each at its
asking price; a simulated or unverified node serves only its owner, so it is never in these).
Within a group, heaps keyed by (rate, node id):

- `whole[k]`: nodes with exactly k fully free GPUs;
- `share[(N, s)]`: nodes divided into N shares per GPU that have a GPU with exactly s free
  shares (a node sits in one heap per distinct s).

CPU-only work (R-JOB-2) has groups of its own, per (owner, region) and per region for
public nodes, of the active nodes that offer CPUs to CPU-only jobs; their `whole[k]` holds
the nodes with exactly k free CPUs.

A whole-GPU request for c GPUs looks at the heads of `whole[c..]`; a fractional one at
`share[(N, s)]` for s >= its need on N-share nodes; a CPU-only one for c CPUs at the heads
of its groups' `whole[c..]`. The head's key is the reference key
(own first, cost, tightness, id), so the minimum over the heads is the reference answer.
Heaps delete lazily (a node's entries carry its version, from one counter: a version is
never used twice, so an entry of a node's earlier life never comes back valid). Pure: no I/O.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal

from gpufleet_contracts.catalog import catalog

from .placement import (
    NO_CPUS,
    REMOVED,
    NodeView,
    NoPlacement,
    Placement,
    WorkerRequest,
    effective_rate,
    fit,
    rule_out,
    shares_needed,
)

Entry = tuple[Decimal, str, int]  # (rate, node id, version)
CPUS = None  # the "type" a CPU-only request searches (memo keys)


@dataclass
class _Heap:
    items: list[Entry] = field(default_factory=list)

    def push(self, e: Entry) -> None:
        heapq.heappush(self.items, e)

    def first(
        self, valid: Mapping[str, int], accept: object = None
    ) -> Iterator[tuple[Decimal, str]]:
        """Valid entries in order (popping stale ones; pushes back what it looked at)."""
        seen: list[Entry] = []
        try:
            while self.items:
                e = self.items[0]
                if valid.get(e[1]) != e[2]:
                    heapq.heappop(self.items)
                    continue
                yield e[0], e[1]
                seen.append(heapq.heappop(self.items))
        finally:
            for e in seen:
                heapq.heappush(self.items, e)


@dataclass
class _Group:
    rate: Decimal | None  # one rate for an owner's group; None: each node's price
    whole: dict[int, _Heap] = field(default_factory=dict)
    share: dict[tuple[int, int], _Heap] = field(default_factory=dict)


class PlacementIndex:
    def __init__(self, nodes: list[NodeView] | None = None) -> None:
        self.nodes: dict[str, NodeView] = {}
        self._version: dict[str, int] = {}  # only indexed (active, priced) nodes
        self._own: dict[tuple[str, str], dict[str, _Group]] = {}
        self._public: dict[str, dict[str, _Group]] = {}
        self._cpu_own: dict[str, dict[str, _Group]] = {}  # owner -> region -> group
        self._cpu_public: dict[str, _Group] = {}  # region -> group
        self._stale = 0
        self._clock = 0  # the last version given
        self._states: Counter[str] = Counter()  # nodes by state
        self._by_model: dict[str | None, set[str]] = {}  # active nodes by GPU model
        self._cpu_nodes: set[str] = set()  # active nodes that offer CPUs to CPU-only jobs
        for n in nodes or []:
            self.upsert(n)

    # --- changes --------------------------------------------------------------------

    def upsert(self, node: NodeView) -> None:
        self._forget(node.node_id)
        self.nodes[node.node_id] = node
        self._states[node.state] += 1
        if node.state == "active":
            self._by_model.setdefault(node.gpu_model, set()).add(node.node_id)
            if node.cpus > 0:
                self._cpu_nodes.add(node.node_id)
        self._version.pop(node.node_id, None)
        self._clock += 1
        version = self._clock
        self._stale += 1
        if node.state != "active":
            return
        if node.gpu_model is not None and node.gpu_model in catalog().gpus:
            self._version[node.node_id] = version
            own_rate = catalog().usage_fee_per_gpu_hour(node.gpu_model)
            groups = self._own.setdefault((node.gpu_model, node.owner), {})
            own = groups.setdefault(node.region, _Group(rate=own_rate))
            self._enter(own, node, own_rate, version)
            # A simulated or unverified node serves only its owner: never in a public group.
            if (
                node.allow_public_jobs
                and node.price_per_gpu_hour is not None
                and not node.simulated
                and node.verified
            ):
                pub = self._public.setdefault(node.gpu_model, {})
                group = pub.setdefault(node.region, _Group(rate=None))
                self._enter(group, node, node.price_per_gpu_hour, version)
        if node.cpus > 0:
            self._version[node.node_id] = version
            cpu_rate = catalog().usage_fee_per_cpu_hour
            mine = self._cpu_own.setdefault(node.owner, {})
            self._enter_cpus(mine.setdefault(node.region, _Group(rate=cpu_rate)), node, cpu_rate)
            if (
                node.allow_public_jobs
                and node.price_per_cpu_hour is not None
                and not node.simulated
                and node.verified
            ):
                group = self._cpu_public.setdefault(node.region, _Group(rate=None))
                self._enter_cpus(group, node, node.price_per_cpu_hour)
        if self._stale > 4 * max(1000, len(self._version)):
            self._compact()

    def remove(self, node_id: str) -> None:
        self._forget(node_id)
        self.nodes.pop(node_id, None)
        self._version.pop(node_id, None)

    def _forget(self, node_id: str) -> None:
        old = self.nodes.get(node_id)
        if old is not None:
            self._states[old.state] -= 1
            if old.state == "active":
                self._by_model.get(old.gpu_model, set()).discard(node_id)
                self._cpu_nodes.discard(node_id)

    def _enter(self, g: _Group, node: NodeView, rate: Decimal, version: int) -> None:
        e = (rate, node.node_id, version)
        k = len(node.free_indices)
        if k:
            g.whole.setdefault(k, _Heap()).push(e)
        if node.gpu_shares > 1:
            for s in {s for s, _ in node.share_slots()}:
                g.share.setdefault((node.gpu_shares, s), _Heap()).push(e)

    def _enter_cpus(self, g: _Group, node: NodeView, rate: Decimal) -> None:
        if node.free_cpus > 0:
            g.whole.setdefault(node.free_cpus, _Heap()).push((rate, node.node_id, self._clock))

    def _compact(self) -> None:
        nodes = list(self.nodes.values())
        self.__init__(nodes)  # type: ignore[misc]

    def take(self, p: Placement) -> NodeView:
        """The node after `p` is placed on it (and indexed so)."""
        node = self.nodes[p.node.node_id]
        if p.cpus:
            new = replace(node, free_cpus=node.free_cpus - p.cpus)
        elif p.shares:
            gpu = p.gpu_indices[0]
            slots = dict(node.partial)
            left = slots.get(gpu, node.gpu_shares if gpu in node.free_indices else 0) - p.shares
            slots[gpu] = left
            free = tuple(i for i in node.free_indices if i != gpu)
            partial = tuple(sorted((i, s) for i, s in slots.items() if 0 < s < node.gpu_shares))
            new = replace(node, free_indices=free, partial=partial)
        else:
            free = tuple(i for i in node.free_indices if i not in p.gpu_indices)
            new = replace(node, free_indices=free)
        self.upsert(new)
        return new

    # --- the decision ---------------------------------------------------------------

    def place(
        self,
        req: WorkerRequest,
        reserved: Mapping[str, str] | None = None,
        memo: dict[tuple[object, ...], int] | None = None,
    ) -> Placement | None:
        """The reference answer for `req`. `memo` (one per pass, while capacity only
        shrinks and holds only grow) remembers searches that found nothing: (own or public,
        GPU type, region, price, fraction, secrets, base environment[, owner]) -> the
        smallest count that failed; a
        request for as many GPUs or more skips that search. A holder of a held node does
        not use it (it may see that node)."""
        held = reserved or {}
        if memo is not None and req.job_id in held.values():
            memo = None
        best: tuple[tuple[object, ...], str, int] | None = None
        types: tuple[str | None, ...] = (CPUS,) if req.cpu_count else req.gpu_types
        for own in (True, False):
            for t in types:
                base = (
                    own,
                    t,
                    req.region,
                    req.max_price,
                    req.fraction,
                    req.secrets,
                    req.environment,
                )
                key = (*base, req.owner)
                if memo is not None:
                    failed = min(memo.get(key, 1 << 30), memo.get(base, 1 << 30))
                    if failed <= req.size:
                        continue
                found = False
                skipped = [False]  # the search passed over the owner's own nodes
                for g in self._groups(req, t, own):
                    for k, node_id, shares in self._candidates(g, req, own, held, skipped):
                        found = True
                        if best is None or k < best[0]:
                            best = (k, node_id, shares)
                if not found and memo is not None:
                    mk = key if (own or skipped[0]) else base
                    memo[mk] = min(memo.get(mk, 1 << 30), req.size)
            if best is not None:
                break
        if best is None:
            return None
        return self._placement(req, best[1], best[2])

    def _groups(self, req: WorkerRequest, model: str | None, own: bool) -> Iterator[_Group]:
        regions: dict[str, _Group]
        if model is CPUS:
            regions = self._cpu_own.get(req.owner, {}) if own else self._cpu_public
        else:
            regions = self._own.get((model, req.owner), {}) if own else self._public.get(model, {})
        if req.region is not None:
            if not own:  # a pin is to a region of the job's owner (placement.rule_out)
                return
            g = regions.get(req.region)
            if g is not None:
                yield g
            return
        yield from regions.values()

    def _candidates(
        self,
        g: _Group,
        req: WorkerRequest,
        own: bool,
        held: Mapping[str, str],
        skipped: list[bool] | None = None,
    ) -> Iterator[tuple[tuple[object, ...], str, int]]:
        if own and g.rate is not None and req.max_price is not None and g.rate > req.max_price:
            return
        rank = 0 if own else 1

        def ok(rate: Decimal, node_id: str) -> bool | None:
            """True: take; False: skip; None: stop (rates only grow from here)."""
            if req.max_price is not None and rate > req.max_price:
                return None
            node = self.nodes[node_id]
            if not own and node.owner == req.owner:
                if skipped is not None:
                    skipped[0] = True
                return False  # the owner's own node is in its own group
            if (node.cpus if req.cpu_count else len(node.gpu_indices)) < req.size:
                return False
            if req.secrets and node.sealing_key is None:
                return False  # it cannot receive them (placement.UNSEALED)
            if req.environment is not None and not node.environments.offers(req.environment):
                return False  # placement.no_environment
            h = held.get(node_id)
            return h is None or h == req.job_id

        if req.fraction is None:  # whole GPUs, or CPUs
            for k, heap in g.whole.items():
                if k < req.size:
                    continue
                for rate, node_id in heap.first(self._version):
                    verdict = ok(rate, node_id)
                    if verdict is None:
                        break
                    if verdict:
                        yield (rank, rate, k, node_id), node_id, 0
                        break
            return
        for (n, s), heap in g.share.items():
            need = shares_needed(req.fraction, n)
            if s < need:
                continue
            for rate, node_id in heap.first(self._version):
                verdict = ok(rate, node_id)
                if verdict is None:
                    break
                if verdict:
                    yield (rank, effective_rate(rate, need, n), s, node_id), node_id, need
                    break
        # Undivided nodes (1 share per GPU) take a fractional worker on a whole GPU.
        for k, heap in g.whole.items():
            for rate, node_id in heap.first(self._version):
                if self.nodes[node_id].gpu_shares > 1:
                    continue
                verdict = ok(rate, node_id)
                if verdict is None:
                    break
                if verdict:
                    yield (rank, rate, 1, node_id), node_id, 1
                    break
            _ = k

    def active_of(self, model: str) -> list[str]:
        """Ids of the active nodes with GPU `model`."""
        return sorted(self._by_model.get(model, ()))

    def active_for(self, req: WorkerRequest) -> list[str]:
        """Ids of the active nodes that may take `req` (of its GPU types, or offering CPUs)."""
        if req.cpu_count:
            return list(self._cpu_nodes)
        return [n for t in req.gpu_types for n in self._by_model.get(t, ())]

    def _placement(self, req: WorkerRequest, node_id: str, shares: int) -> Placement:
        return fit(req, self.nodes[node_id])[1]

    def explain(self, req: WorkerRequest, reserved: Mapping[str, str] | None = None) -> NoPlacement:
        """What rules each node out for `req`: the counts of `placement.why_not`, looking
        only at active nodes of the requested models (the rest are counted in bulk, removed
        nodes not at all)."""
        reasons: Counter[str] = Counter()
        for state, n in self._states.items():
            if state not in ("active", REMOVED) and n > 0:
                reasons[f"{state}, not active"] += n
        candidates = 0
        for node_id in self.active_for(req):
            candidates += 1
            reasons[rule_out(req, self.nodes[node_id], reserved) or "free now"] += 1
        others = self._states["active"] - candidates
        if others > 0:
            reasons[NO_CPUS if req.cpu_count else f"no {' or '.join(req.gpu_types)}"] += others
        return NoPlacement(+reasons)
