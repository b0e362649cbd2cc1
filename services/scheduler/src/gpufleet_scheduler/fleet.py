"""The scheduler's picture of the fleet: nodes and which GPU (shares) are claimed. Pure.

A claim is one document per GPU share, unique id: `<node>:<gpu>` on an undivided node,
`<node>:<gpu>:<share>` on a node divided into shares (R-SCHED-4). A whole GPU on a divided
node is all of its shares. The unique id is what makes giving a GPU twice impossible, even
to two schedulers at once. This class mirrors the claims, which the leader rebuilds from
the open jobs' workers (each holding worker records its claims; the `claims` collection is
written in the same transaction and holds the same).

CPUs offered to CPU-only jobs (R-JOB-2) are claimed the same way, one document per CPU,
`<node>:cpu:<k>` for the node's CPU slot k (0 <= k < the CPUs it offers): in memory and in
a worker's `claims` a CPU slot is (`CPU`, k), the GPU index `CPU` (-1) being no GPU's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from decimal import Decimal

from gpufleet_store import Doc

from . import environments
from .index import PlacementIndex
from .placement import NodeView, Placement

CPU = -1  # the "GPU index" of a CPU slot's claim (its share: the slot)


def claim_id(node_id: str, gpu: int, share: int, shares: int) -> str:
    if gpu == CPU:
        return f"{node_id}:cpu:{share}"
    return f"{node_id}:{gpu}" if shares == 1 else f"{node_id}:{gpu}:{share}"


def node_view(doc: Doc) -> NodeView:
    """A node document (as written by `Scheduler.node_changed`) with nothing claimed."""
    indices = tuple(doc.get("gpu_indices") or [])
    price = doc.get("price_per_gpu_hour")
    cpus = int(doc.get("cpus") or 0)
    cpu_price = doc.get("price_per_cpu_hour")
    return NodeView(
        node_id=doc["_id"],
        minion_id=doc["minion_id"],
        region=doc["region"],
        owner=doc["owner"],
        state=doc["state"],
        gpu_model=doc.get("gpu_model"),
        gpu_indices=indices,
        free_indices=indices,
        price_per_gpu_hour=Decimal(price) if price else None,
        allow_public_jobs=bool(doc.get("allow_public_jobs")),
        gpu_shares=int(doc.get("gpu_shares") or 1),
        gpu_memory_mb=doc.get("gpu_memory_mb"),
        simulated=bool(doc.get("simulated")),  # absent in documents written before it was kept
        verified=bool(doc.get("verified")),  # the provisioner's verdict (absent before: not)
        cpus=cpus,
        free_cpus=cpus,
        price_per_cpu_hour=Decimal(cpu_price) if cpu_price is not None else None,
        sealing_key=doc.get("sealing_key"),  # absent before nodes had one: none
        environments=environments.offer_of(doc.get("environments")),  # absent: BUILT_IN
        proxy_url=doc.get("proxy_url"),  # absent before nodes served endpoints: none
    )


class Fleet:
    def __init__(self) -> None:
        self.base: dict[str, NodeView] = {}  # as registered, nothing claimed
        self.used: dict[str, dict[int, set[int]]] = {}  # node -> GPU -> claimed shares
        self.index = PlacementIndex()

    def load(self, nodes: list[Doc], claims: list[Doc]) -> None:
        self.base = {n["_id"]: node_view(n) for n in nodes}
        self.set_claims(claims)

    def set_claims(self, claims: list[Doc]) -> None:
        """Replace every claim (and rebuild the index) with `claims`."""
        self.used = {}
        for c in claims:
            self._mark(c["node_id"], c["gpu_index"], int(c.get("share", 0)), True)
        self.index = PlacementIndex([self.view(nid) for nid in self.base])

    def node(self, node_id: str) -> NodeView | None:
        """The node as registered (nothing claimed), if known."""
        return self.base.get(node_id)

    def nodes(self) -> list[NodeView]:
        return list(self.base.values())

    def reset_claims(self, node_ids: Iterable[str], claims: list[Doc]) -> None:
        """The claims of these nodes are now `claims` (read again from the store)."""
        ids = set(node_ids)
        for nid in ids:
            self.used.pop(nid, None)
        for c in claims:
            self._mark(c["node_id"], c["gpu_index"], int(c.get("share", 0)), True)
        for nid in ids:
            self._refresh(nid)

    def clear_claims(self, node_id: str) -> None:
        """Nothing is claimed on this node any more (it was lost or removed)."""
        self.used.pop(node_id, None)
        self._refresh(node_id)

    def upsert(self, node: NodeView) -> None:
        self.base[node.node_id] = node
        self._refresh(node.node_id)

    def set_state(self, node_id: str, state: str) -> NodeView | None:
        node = self.base.get(node_id)
        if node is None:
            return None
        self.base[node_id] = replace(node, state=state)
        self._refresh(node_id)
        return self.base[node_id]

    def set_verified(self, node_id: str, verified: bool) -> None:
        """The provisioner's verdict on the node's hardware (NodeVerified)."""
        node = self.base.get(node_id)
        if node is not None:
            self.base[node_id] = replace(node, verified=verified)
            self._refresh(node_id)

    def view(self, node_id: str) -> NodeView:
        """The node with its current free GPUs and partly used GPUs."""
        node = self.base[node_id]
        used = self.used.get(node_id, {})
        free = tuple(i for i in node.gpu_indices if not used.get(i))
        partial = tuple(
            (i, node.gpu_shares - len(used[i]))
            for i in node.gpu_indices
            if used.get(i) and len(used[i]) < node.gpu_shares
        )
        free_cpus = max(0, node.cpus - len(used.get(CPU, ())))
        return replace(node, free_indices=free, partial=partial, free_cpus=free_cpus)

    def claims_for(self, p: Placement) -> list[tuple[str, int, int]]:
        """(claim id, GPU, share) for placement `p`: every share of a whole GPU, or the
        lowest free shares of the chosen GPU; a CPU-only worker's: (id, CPU, slot) of the
        lowest free CPU slots."""
        node = self.base[p.node.node_id]
        used = self.used.get(node.node_id, {})
        if p.cpus:
            taken = used.get(CPU, set())
            slots = [k for k in range(node.cpus) if k not in taken][: p.cpus]
            return [(claim_id(node.node_id, CPU, k, 1), CPU, k) for k in slots]
        out: list[tuple[str, int, int]] = []
        for gpu in p.gpu_indices:
            taken = used.get(gpu, set())
            free = [s for s in range(node.gpu_shares) if s not in taken]
            want = free[: p.shares] if p.shares else free
            out += [(claim_id(node.node_id, gpu, s, node.gpu_shares), gpu, s) for s in want]
        return out

    def claim(self, node_id: str, slots: list[tuple[str, int, int]]) -> None:
        for _, gpu, share in slots:
            self._mark(node_id, gpu, share, True)
        self._refresh(node_id)

    def release(self, node_id: str, slots: list[tuple[int, int]]) -> None:
        for gpu, share in slots:
            self._mark(node_id, gpu, share, False)
        self._refresh(node_id)

    def _mark(self, node_id: str, gpu: int, share: int, on: bool) -> None:
        gpus = self.used.setdefault(node_id, {})
        if on:
            gpus.setdefault(gpu, set()).add(share)
        else:
            gpus.get(gpu, set()).discard(share)

    def _refresh(self, node_id: str) -> None:
        if node_id in self.base:
            self.index.upsert(self.view(node_id))

    def regions_with(self, gpu_types: list[str]) -> dict[str, set[str]]:
        """Region -> the job's GPU types it has (any node not removed) (R-RES-1)."""
        out: dict[str, set[str]] = {}
        for n in self.base.values():
            if n.state != "removed" and n.gpu_model is not None:
                out.setdefault(n.region, set())
                if n.gpu_model in gpu_types:
                    out[n.region].add(n.gpu_model)
        return out


def node_doc(node: NodeView) -> Doc:
    """The inverse of `node_view`: a node as its document holds it (for checkpoints)."""
    return {
        "_id": node.node_id,
        "minion_id": node.minion_id,
        "region": node.region,
        "owner": node.owner,
        "state": node.state,
        "gpu_model": node.gpu_model,
        "gpu_indices": list(node.gpu_indices),
        "price_per_gpu_hour": None
        if node.price_per_gpu_hour is None
        else str(node.price_per_gpu_hour),
        "allow_public_jobs": node.allow_public_jobs,
        "gpu_shares": node.gpu_shares,
        "gpu_memory_mb": node.gpu_memory_mb,
        "simulated": node.simulated,
        "verified": node.verified,
        "cpus": node.cpus,
        "price_per_cpu_hour": None
        if node.price_per_cpu_hour is None
        else str(node.price_per_cpu_hour),
        "sealing_key": node.sealing_key,
        "environments": environments.stored(node.environments),
        "proxy_url": node.proxy_url,
    }
