"""CPU-only workers (R-JOB-2) on plain data: where they go, what they pay, why they wait,
the CPU slots they claim, and the queue pass with them beside GPU work."""

from dataclasses import replace
from decimal import Decimal

from gpufleet_scheduler.fleet import CPU, Fleet
from gpufleet_scheduler.index import PlacementIndex
from gpufleet_scheduler.placement import (
    NodeView,
    NoPlacement,
    Placement,
    WorkerRequest,
    place,
    why_not,
)
from gpufleet_scheduler.queue import Waiting, plan


def node(
    nid: str,
    cpus: int = 16,
    free: int | None = None,
    *,
    owner: str = "acme",
    gpus: int = 2,
    price: str | None = None,
    public: bool = False,
    region: str = "local",
    verified: bool = True,
) -> NodeView:
    idx = tuple(range(gpus))
    return NodeView(
        node_id=nid,
        minion_id=nid,
        region=region,
        owner=owner,
        state="active",
        gpu_model="RTX 3090" if gpus else None,
        gpu_indices=idx,
        free_indices=idx,
        cpus=cpus,
        free_cpus=cpus if free is None else free,
        price_per_cpu_hour=None if price is None else Decimal(price),
        allow_public_jobs=public,
        verified=verified,  # its check passed (the provisioner's NodeVerified)
    )


def cpu_req(
    cpus: int = 8, owner: str = "acme", max_price: str | None = None, job: str = "j"
) -> WorkerRequest:
    return WorkerRequest(
        job_id=job,
        worker=0,
        owner=owner,
        gpu_types=(),
        gpu_count=0,
        max_price=None if max_price is None else Decimal(max_price),
        cpu_count=cpus,
    )


def test_own_node_charges_the_cpu_usage_fee_and_reserves_cpus_not_gpus() -> None:
    d = place(cpu_req(8), [node("a")])
    assert isinstance(d, Placement)
    assert (d.cpus, d.gpu_indices, d.charge) == (8, (), "usage")
    assert d.rate == Decimal("0.0125")  # per CPU-hour: 0.05 (development GPU-hour) / 4


def test_a_node_without_gpus_takes_cpu_work_and_no_gpu_work() -> None:
    cpu_only = node("c", cpus=64, gpus=0)
    assert isinstance(place(cpu_req(32), [cpu_only]), Placement)
    gpu = WorkerRequest("g", 0, "acme", ("RTX 3090",), 1, None)
    assert place(gpu, [cpu_only]) == NoPlacement(why_not(gpu, [cpu_only]).reasons)
    assert why_not(gpu, [cpu_only]).explain() == "1 node: no RTX 3090"


def test_why_cpu_work_waits() -> None:
    nodes = [
        node("none", cpus=0),  # its CPUs all feed its GPUs
        node("small", cpus=4),
        node("busy", cpus=16, free=4),
        node("theirs", owner="other"),  # not public
    ]
    got = place(cpu_req(8), nodes)
    assert isinstance(got, NoPlacement)
    assert got.explain() == (
        "1 node: another account's node, region not open to public jobs; "
        "1 node: busy (4 of 16 CPUs free, needs 8); "
        "1 node: offers 4 CPUs to CPU-only jobs, job needs 8; "
        "1 node: offers no CPUs to CPU-only jobs"
    )
    index = PlacementIndex(nodes)
    assert index.place(cpu_req(8)) is None
    assert index.explain(cpu_req(8)).reasons == got.reasons


def test_why_cpu_work_waits_speaks_of_cpus_not_gpus() -> None:
    """Every reason a CPU-only worker can be given, on a fleet that gives each: none names
    GPUs (a CPU-only job asks for none)."""
    nodes = [
        node("none", cpus=0),
        node("small", cpus=4),
        node("busy", cpus=16, free=4),
        node("theirs", owner="other"),
        replace(node("sim", owner="other", price="0.01", public=True), simulated=True),
        node("dear", owner="other", price="0.50", public=True),
        replace(node("off"), state="maintenance"),
    ]
    asked = cpu_req(8, max_price="0.10")
    got = why_not(asked, nodes)
    assert "1 node: another account's simulated node (its owner's jobs only)" in got.explain()
    assert len(got.reasons) == len(nodes)  # one reason each
    assert not [r for r in got.reasons if "GPU" in r]
    assert PlacementIndex(nodes).explain(asked).reasons == got.reasons
    # Pinned to region `local`: every other account's node is in a region of theirs.
    nodes.append(node("away", region="elsewhere"))
    pinned = replace(asked, region="local")
    got = why_not(pinned, nodes)
    assert got.reasons["not in pinned region local"] == 4  # theirs, sim, dear, away
    assert not [r for r in got.reasons if "GPU" in r]
    assert PlacementIndex(nodes).explain(pinned).reasons == got.reasons


def test_another_accounts_public_node_at_its_cpu_price_within_max_price() -> None:
    seller = node("s", owner="seller", price="0.02", public=True)
    unpriced = node("u", owner="seller", public=True)  # sells GPUs, not CPUs
    d = place(cpu_req(8, max_price="0.05"), [seller, unpriced])
    assert isinstance(d, Placement) and d.node.node_id == "s"
    assert (d.rate, d.charge) == (Decimal("0.02"), "market")
    too_dear = place(cpu_req(8, max_price="0.01"), [seller])
    assert isinstance(too_dear, NoPlacement)
    assert too_dear.explain() == "1 node: 0.02 > max price 0.01"


def test_another_accounts_unverified_node_sells_no_cpus() -> None:
    """Verified nodes: a CPU-only job of another account never goes to a node whose
    check did not pass; its owner's does."""
    seller = node("s", owner="seller", price="0.001", public=True, verified=False)
    d = place(cpu_req(8), [seller])
    assert isinstance(d, NoPlacement)
    assert d.explain() == "1 node: another account's node, not verified"
    assert PlacementIndex([seller]).place(cpu_req(8)) is None
    assert PlacementIndex([seller]).explain(cpu_req(8)).reasons == d.reasons
    own = cpu_req(8, owner="seller")
    placed = place(own, [seller])
    assert isinstance(placed, Placement) and placed.charge == "usage"
    assert PlacementIndex([seller]).place(own) == placed


def test_own_node_first_then_cheapest_then_fullest() -> None:
    nodes = [
        node("roomy", cpus=32),
        node("tight", cpus=32, free=8),
        node("cheap", owner="seller", price="0.001", public=True),
    ]
    d = place(cpu_req(8), nodes)
    assert isinstance(d, Placement) and d.node.node_id == "tight"
    assert PlacementIndex(nodes).place(cpu_req(8)) == d


def test_a_node_indexed_again_after_maintenance_is_not_seen_with_its_old_capacity() -> None:
    """An index entry from a node's earlier life must not come back valid: here the node was
    active with 2 free GPUs (and 16 free CPUs), then in maintenance, then active again with
    1 GPU and 4 CPUs free."""
    n = node("a", cpus=16)
    index = PlacementIndex([n])
    index.upsert(replace(n, state="maintenance"))
    index.upsert(replace(n, free_indices=(0,), free_cpus=4))
    assert index.place(WorkerRequest("g", 0, "acme", ("RTX 3090",), 2, None)) is None
    assert index.place(cpu_req(8)) is None


def test_cpu_slots_are_claimed_lowest_first_and_freed() -> None:
    fleet = Fleet()
    fleet.load(
        [
            {
                "_id": "a",
                "minion_id": "a",
                "region": "r",
                "owner": "acme",
                "state": "active",
                "gpu_model": "RTX 3090",
                "gpu_indices": [0],
                "cpus": 12,
            }
        ],
        [{"node_id": "a", "gpu_index": CPU, "share": 1}],
    )
    assert fleet.view("a").free_cpus == 11
    p = fleet.index.place(cpu_req(8))
    assert p is not None
    slots = fleet.claims_for(p)
    assert [s[0] for s in slots] == ["a:cpu:0", *[f"a:cpu:{k}" for k in range(2, 9)]]
    fleet.claim("a", slots)
    assert fleet.view("a").free_cpus == 3 and fleet.view("a").free_indices == (0,)
    assert fleet.index.place(cpu_req(4)) is None
    fleet.release("a", [(g, k) for _, g, k in slots])
    assert fleet.view("a").free_cpus == 11


def wait(job: str, at_ms: int, cpus: int) -> Waiting:
    return Waiting(req=cpu_req(cpus, job=job), queued_ms=at_ms)


def test_a_pass_places_cpu_work_oldest_first_beside_gpu_work() -> None:
    index = PlacementIndex([node("a", cpus=16, gpus=1)])
    gpu = Waiting(WorkerRequest("gpu", 0, "acme", ("RTX 3090",), 1, None), queued_ms=3)
    r = plan([wait("young", 2, 8), wait("old", 1, 12), gpu], index, now_ms=10)
    assert [(w.req.job_id, p.node.node_id) for w, p in r.placed] == [("old", "a"), ("gpu", "a")]
    assert r.reasons[("young", 0)].explain() == "1 node: busy (4 of 16 CPUs free, needs 8)"


def test_a_starving_cpu_job_holds_the_node_closest_to_fitting() -> None:
    index = PlacementIndex([node("a", cpus=16, free=4), node("b", cpus=16, free=12)])
    r = plan([wait("big", 0, 16), wait("small", 600_000, 4)], index, now_ms=600_001)
    assert r.holds == {"b": "big"}
    assert [(w.req.job_id, p.node.node_id) for w, p in r.placed] == [("small", "a")]
