"""Placement on plain data (R-SCHED-1, R-SCHED-2, R-BILL-1)."""

from decimal import Decimal

from gpufleet_scheduler.placement import NodeView, NoPlacement, Placement, WorkerRequest, place


def node(
    nid: str,
    model: str = "RTX 3090",
    gpus: int = 2,
    free: int | None = None,
    owner: str = "acme",
    state: str = "active",
    price: str | None = None,
    public: bool = False,
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
