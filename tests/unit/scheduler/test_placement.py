"""Placement on plain data (R-SCHED-1, R-SCHED-2, R-BILL-1)."""

import random
from dataclasses import replace
from decimal import Decimal

from gpufleet_scheduler.fleet import node_doc
from gpufleet_scheduler.fleet import node_view as fleet_node_view
from gpufleet_scheduler.index import PlacementIndex
from gpufleet_scheduler.placement import (
    NodeView,
    NoPlacement,
    Placement,
    WorkerRequest,
    fit,
    place,
    rule_out,
    why_not,
)


def node(
    nid: str,
    model: str = "RTX 3090",
    gpus: int = 2,
    free: int | None = None,
    owner: str = "acme",
    state: str = "active",
    price: str | None = None,
    public: bool = False,
    simulated: bool = False,
    verified: bool = True,
) -> NodeView:
    idx = tuple(range(gpus))
    return NodeView(
        node_id=nid,
        minion_id=nid,
        region="local",
        owner=owner,
        state=state,
        gpu_model=model,
        gpu_indices=idx,
        free_indices=idx[: gpus if free is None else free],
        price_per_gpu_hour=None if price is None else Decimal(price),
        allow_public_jobs=public,
        simulated=simulated,
        # a node that passed its GPU check (as the provisioner says); simulated ones never do
        verified=verified and not simulated,
    )


def req(
    types: tuple[str, ...] = ("RTX 3090",),
    count: int = 1,
    max_price: str | None = "1.0",
    owner: str = "acme",
) -> WorkerRequest:
    return WorkerRequest(
        job_id="j",
        worker=0,
        owner=owner,
        gpu_types=types,
        gpu_count=count,
        max_price=None if max_price is None else Decimal(max_price),
    )


def test_own_node_is_charged_the_usage_fee_of_its_class() -> None:
    d = place(req(), [node("a")])
    assert isinstance(d, Placement)
    assert d.rate == Decimal("0.05") and d.charge == "usage" and d.gpu_indices == (0,)


def test_lowest_cost_wins_among_fitting_nodes() -> None:
    nodes = [
        node("pro", model="RTX A6000"),  # 0.10 usage fee
        node("dev", model="RTX 3090"),  # 0.05
        node("dc", model="A100 80GB"),  # 0.25
    ]
    d = place(req(types=("RTX A6000", "RTX 3090", "A100 80GB")), nodes)
    assert isinstance(d, Placement) and d.node.node_id == "dev"


def test_own_nodes_come_before_cheaper_public_ones() -> None:
    theirs = node("theirs", owner="other", price="0.01", public=True)
    mine = node("mine", model="A100 80GB")
    d = place(req(types=("RTX 3090", "A100 80GB")), [theirs, mine])
    assert isinstance(d, Placement) and d.node.node_id == "mine"


def test_other_accounts_nodes_only_in_public_regions_at_their_price() -> None:
    private = node("private", owner="other", price="0.30")
    assert isinstance(place(req(), [private]), NoPlacement)
    public = node("public", owner="other", price="0.30", public=True)
    d = place(req(), [public])
    assert isinstance(d, Placement) and d.rate == Decimal("0.30") and d.charge == "market"


def test_a_simulated_node_runs_its_owners_jobs() -> None:
    sim = node("sim", simulated=True)
    d = place(req(owner="acme"), [sim])
    assert isinstance(d, Placement) and d.node.node_id == "sim" and d.charge == "usage"
    assert PlacementIndex([sim]).place(req(owner="acme")) == d


def test_a_simulated_node_never_runs_another_accounts_jobs() -> None:
    # Open to public jobs and the cheapest: still not for "beta" (R-NODE-6).
    sim = node("sim", owner="acme", price="0.01", public=True, simulated=True)
    real = node("real", owner="gamma", price="0.50", public=True)
    r = req(owner="beta")
    d = place(r, [sim])
    assert isinstance(d, NoPlacement)
    assert d.explain() == "1 node: another account's node with simulated GPUs"
    index = PlacementIndex([sim])
    assert index.place(r) is None and index.explain(r).reasons == d.reasons
    both = place(r, [sim, real])
    assert isinstance(both, Placement) and both.node.node_id == "real"
    assert PlacementIndex([sim, real]).place(r) == both


def test_the_schedulers_node_document_keeps_simulated() -> None:
    sim = node("sim", simulated=True)
    assert fleet_node_view(node_doc(sim)) == sim
    assert fleet_node_view({**node_doc(sim), "simulated": None}).simulated is False


def test_an_unverified_node_runs_only_its_owners_jobs() -> None:
    """Verified nodes: open to public jobs, real, the cheapest, but its hardware did not
    pass (or has not had) its GPU check: not for another account, still for its owner."""
    unverified = node("forged", owner="acme", price="0.01", public=True, verified=False)
    verified = node("honest", owner="gamma", price="0.50", public=True)
    other = req(owner="beta")
    d = place(other, [unverified])
    assert isinstance(d, NoPlacement)
    assert d.explain() == "1 node: another account's node, not verified"
    index = PlacementIndex([unverified])
    assert index.place(other) is None and index.explain(other).reasons == d.reasons
    both = place(other, [unverified, verified])
    assert isinstance(both, Placement) and both.node.node_id == "honest"
    assert PlacementIndex([unverified, verified]).place(other) == both
    own = place(req(owner="acme"), [unverified])
    assert isinstance(own, Placement) and own.node.node_id == "forged" and own.charge == "usage"
    assert PlacementIndex([unverified]).place(req(owner="acme")) == own
    # not open to public jobs: that reason comes first, whatever its check said
    private = node("private", owner="acme", price="0.01", verified=False)
    refused = place(other, [private])
    assert isinstance(refused, NoPlacement)
    assert refused.explain() == "1 node: another account's node, region not open to public jobs"


def test_the_schedulers_node_document_keeps_verified() -> None:
    checked = node("checked", owner="gamma", price="0.5", public=True)
    assert checked.verified and fleet_node_view(node_doc(checked)) == checked
    assert fleet_node_view({**node_doc(checked), "verified": None}).verified is False
    older = {k: v for k, v in node_doc(checked).items() if k != "verified"}  # before it was kept
    assert fleet_node_view(older).verified is False


def test_max_price_rules_out_expensive_nodes() -> None:
    d = place(req(max_price="0.20"), [node("x", owner="other", price="0.30", public=True)])
    assert isinstance(d, NoPlacement)
    assert "0.30 > max price 0.20" in d.explain()


def test_reasons_are_counted_per_cause() -> None:
    nodes = [
        node("a", model="T4"),
        node("b", model="T4"),
        node("c", free=0),
        node("d", state="maintenance"),
    ]
    d = place(req(), nodes)
    assert isinstance(d, NoPlacement)
    text = d.explain()
    assert "2 nodes: no RTX 3090" in text
    assert "1 node: busy (0 of 2 GPUs free, needs 1)" in text
    assert "1 node: maintenance, not active" in text


def test_removed_nodes_are_left_out_of_the_reasons() -> None:
    """A removed node is gone: a waiting job's reasons neither name nor count it, in the
    reference scan and in the index, while the index still knows it."""
    nodes = [node("a", model="T4"), node("gone", state="removed"), node("b", free=0)]
    d = place(req(), nodes)
    assert isinstance(d, NoPlacement)
    assert d.explain() == "1 node: busy (0 of 2 GPUs free, needs 1); 1 node: no RTX 3090"
    assert why_not(req(), nodes).reasons == d.reasons
    index = PlacementIndex(nodes)
    assert index.explain(req()).reasons == d.reasons and "gone" in index.nodes
    only_removed = [node("gone", state="removed")]
    assert why_not(req(), only_removed).explain() == "no nodes registered"
    assert PlacementIndex(only_removed).explain(req()).explain() == "no nodes registered"


def test_no_nodes_at_all_says_so() -> None:
    d = place(req(), [])
    assert isinstance(d, NoPlacement) and d.explain() == "no nodes registered"


def test_gpu_count_larger_than_any_node() -> None:
    d = place(req(count=4), [node("a", gpus=2)])
    assert isinstance(d, NoPlacement) and "has 2 GPUs, job needs 4" in d.explain()


def test_fullest_node_is_preferred_at_equal_cost() -> None:
    d = place(req(), [node("roomy", gpus=4), node("tight", gpus=4, free=1)])
    assert isinstance(d, Placement) and d.node.node_id == "tight"


def test_lowest_free_indices_are_given() -> None:
    n = NodeView(
        node_id="a",
        minion_id="a",
        region="r",
        owner="acme",
        state="active",
        gpu_model="RTX 3090",
        gpu_indices=(0, 1, 2, 3),
        free_indices=(3, 1, 2),
    )
    d = place(req(count=2), [n])
    assert isinstance(d, Placement) and d.gpu_indices == (1, 2)


# --- region pins (R-RES-1), fractional GPUs (R-SCHED-4), the index ----------------------


def test_a_pinned_job_only_goes_to_its_region() -> None:
    far = replace(node("far"), region="eu")
    near = replace(node("near", model="A100 80GB"), region="us")
    r = replace(req(types=("RTX 3090", "A100 80GB")), region="us")
    d = place(r, [far, near])
    assert isinstance(d, Placement) and d.node.node_id == "near"
    d2 = place(replace(r, region="asia"), [far, near])
    assert isinstance(d2, NoPlacement) and "2 nodes: not in pinned region asia" in d2.explain()


def test_another_accounts_region_of_the_same_name_never_takes_a_pinned_job() -> None:
    """Region names are unique per owner only: bob's public `lab` is not acme's `lab`."""
    theirs = replace(node("theirs", owner="bob", price="0.10", public=True), region="lab")
    pinned = replace(req(owner="acme"), region="lab")
    d = place(pinned, [theirs])
    assert isinstance(d, NoPlacement) and "1 node: not in pinned region lab" in d.explain()
    ours = replace(node("ours"), region="lab")
    d2 = place(pinned, [theirs, ours])
    assert isinstance(d2, Placement) and d2.node.node_id == "ours"
    assert isinstance(place(replace(pinned, region=None), [theirs]), Placement)  # unpinned: may


def shared(
    nid: str, shares: int = 4, gpus: int = 2, partial: tuple[tuple[int, int], ...] = ()
) -> NodeView:
    n = node(nid, gpus=gpus)
    used = {i for i, _ in partial}
    return replace(
        n,
        gpu_shares=shares,
        free_indices=tuple(i for i in n.gpu_indices if i not in used),
        partial=partial,
    )


def test_a_fraction_is_packed_onto_the_fullest_gpu_and_pays_its_share() -> None:
    n = shared("s", shares=4, partial=((1, 1),))  # GPU 1 has one share left
    d = place(replace(req(), fraction=Decimal("0.25")), [n])
    assert isinstance(d, Placement)
    assert d.gpu_indices == (1,) and d.shares == 1 and d.fraction == Decimal("0.25")
    assert d.rate == Decimal("0.0125") and d.rate_per_gpu_hour == Decimal("0.05")


def test_a_half_needs_two_quarter_shares_on_one_gpu() -> None:
    n = shared("s", shares=4, gpus=1, partial=((0, 1),))
    d = place(replace(req(), fraction=Decimal("0.5")), [n])
    assert isinstance(d, NoPlacement) and "no GPU with 2 of 4 shares free" in d.explain()


def test_a_fraction_on_an_undivided_node_takes_and_pays_a_whole_gpu() -> None:
    d = place(replace(req(), fraction=Decimal("0.5")), [node("whole")])
    assert isinstance(d, Placement) and d.shares == 1 and d.rate == Decimal("0.05")


def test_divided_nodes_are_cheaper_for_fractions() -> None:
    d = place(replace(req(), fraction=Decimal("0.25")), [node("whole"), shared("quarters")])
    assert isinstance(d, Placement) and d.node.node_id == "quarters"


def test_held_nodes_are_kept_for_their_holder() -> None:
    n = node("a")
    d = place(req(), [n], reserved={"a": "older"})
    assert isinstance(d, NoPlacement) and "held for an older waiting job" in d.explain()
    assert isinstance(
        place(replace(req(), job_id="older"), [n], reserved={"a": "older"}), Placement
    )


MODELS = ("RTX 3090", "RTX A6000", "T4", "A100 80GB")


def random_fleet(rng: random.Random, n: int) -> list[NodeView]:
    out = []
    for i in range(n):
        cpu_node = rng.random() < 0.1  # no GPU at all: CPU-only work alone
        gpus = 0 if cpu_node else rng.choice((1, 2, 4, 8))
        cpus = rng.choice((16, 64)) if cpu_node else rng.choice((0, 0, 8, 16, 32))
        shares = rng.choice((1, 1, 2, 4))
        idx = tuple(range(gpus))
        free: list[int] = []
        partial: list[tuple[int, int]] = []
        for g in idx:
            left = rng.randint(0, shares)
            if left == shares:
                free.append(g)
            elif left > 0:
                partial.append((g, left))
        out.append(
            NodeView(
                node_id=f"n{i:04d}",
                minion_id=f"m{i}",
                region=rng.choice(("eu", "us", "asia")),
                owner=rng.choice(("acme", "beta", "gamma")),
                state=rng.choice(("active",) * 6 + ("maintenance", "lost", "removed")),
                gpu_model=None if cpu_node else rng.choice(MODELS),
                gpu_indices=idx,
                free_indices=tuple(free),
                price_per_gpu_hour=Decimal(rng.choice(("0.02", "0.05", "0.10", "0.40", "1.50"))),
                allow_public_jobs=rng.random() < 0.5,
                gpu_shares=shares,
                partial=tuple(partial),
                simulated=rng.random() < 0.25,
                verified=rng.random() < 0.7,
                cpus=cpus,
                free_cpus=rng.randint(0, cpus),
                price_per_cpu_hour=rng.choice((None, Decimal("0.005"), Decimal("0.02"))),
            )
        )
    return out


def random_request(rng: random.Random, i: int) -> WorkerRequest:
    if rng.random() < 0.25:  # CPU-only (R-JOB-2)
        return WorkerRequest(
            job_id=f"j{i}",
            worker=0,
            owner=rng.choice(("acme", "beta", "gamma", "delta")),
            gpu_types=(),
            gpu_count=0,
            max_price=rng.choice((None, Decimal("0.005"), Decimal("0.0125"), Decimal("1"))),
            region=rng.choice((None, None, "eu", "us")),
            cpu_count=rng.choice((4, 8, 16, 32)),
        )
    return WorkerRequest(
        job_id=f"j{i}",
        worker=0,
        owner=rng.choice(("acme", "beta", "gamma", "delta")),
        gpu_types=tuple(rng.sample(MODELS, rng.randint(1, 2))),
        gpu_count=rng.choice((1, 1, 2, 4, 8)),
        max_price=rng.choice((None, Decimal("0.05"), Decimal("0.2"), Decimal("1"))),
        region=rng.choice((None, None, "eu", "us")),
        fraction=rng.choice((None, None, None, Decimal("0.25"), Decimal("0.5"))),
    )


def test_the_index_agrees_with_the_linear_scan_on_random_fleets() -> None:
    rng = random.Random(7)
    refused_simulated = 0  # requests the simulated-node rule really decided
    refused_unverified = 0  # and the verified-node rule
    cpu_placed = cpu_refused = 0  # CPU-only requests placed / explained
    for _ in range(30):
        fleet = random_fleet(rng, rng.randint(1, 60))
        index = PlacementIndex(fleet)
        holds = {n.node_id: "j-old" for n in rng.sample(fleet, min(3, len(fleet)))}
        for i in range(40):
            r = random_request(rng, i)
            expected = place(r, list(index.nodes.values()), holds)
            got = index.place(r, holds)
            if isinstance(expected, NoPlacement):
                assert got is None
                reasons = why_not(r, list(index.nodes.values()), holds).reasons
                assert index.explain(r, holds).reasons == reasons
                refused_simulated += reasons["another account's node with simulated GPUs"] > 0
                refused_unverified += reasons["another account's node, not verified"] > 0
                cpu_refused += r.cpu_count > 0
            else:
                assert got == expected
                assert expected.node.owner == r.owner or not expected.node.simulated
                assert expected.node.owner == r.owner or expected.node.verified
                assert (expected.cpus, expected.gpu_indices == ()) == (r.cpu_count, r.cpu_count > 0)
                cpu_placed += r.cpu_count > 0
                index.take(got)  # the fleet fills up as the run goes on
    assert refused_simulated > 0 and refused_unverified > 0
    assert cpu_placed > 20 and cpu_refused > 20


def test_lowest_cost_really_is_lowest() -> None:
    rng = random.Random(11)
    for _ in range(200):
        fleet = random_fleet(rng, 12)
        r = random_request(rng, 0)
        d = place(r, fleet)
        if isinstance(d, NoPlacement):
            continue
        own = [n for n in fleet if n.owner == r.owner]
        pool = own if d.node.owner == r.owner else fleet
        for n in pool:
            if rule_out(r, n) is None:
                assert fit(r, n)[1].rate >= d.rate
