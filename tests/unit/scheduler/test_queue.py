"""The queue pass on plain data: oldest first, backfill, anti-starvation holds, reasons."""

from dataclasses import replace
from decimal import Decimal

from gpufleet_scheduler.index import PlacementIndex
from gpufleet_scheduler.placement import NodeView, WorkerRequest
from gpufleet_scheduler.queue import Waiting, plan

MIN = 60_000


def node(nid: str, gpus: int = 2, free: int | None = None, model: str = "RTX 3090") -> NodeView:
    idx = tuple(range(gpus))
    return NodeView(
        node_id=nid,
        minion_id=nid,
        region="local",
        owner="acme",
        state="active",
        gpu_model=model,
        gpu_indices=idx,
        free_indices=idx[: gpus if free is None else free],
    )


def wait(job: str, at_ms: int, count: int = 1, worker: int = 0, **kw: object) -> Waiting:
    r = WorkerRequest(
        job_id=job,
        worker=worker,
        owner="acme",
        gpu_types=("RTX 3090",),
        gpu_count=count,
        max_price=Decimal("1"),
    )
    return Waiting(req=replace(r, **kw), queued_ms=at_ms)


def placed(result: object) -> list[tuple[str, str]]:
    return [(w.req.job_id, p.node.node_id) for w, p in result.placed]  # type: ignore[attr-defined]


def test_oldest_first() -> None:
    index = PlacementIndex([node("a", gpus=1)])
    r = plan([wait("young", 2000), wait("old", 1000)], index, now_ms=3000)
    assert placed(r) == [("old", "a")]
    assert [w.req.job_id for w in r.waiting] == ["young"]
    assert r.reasons[("young", 0)].explain() == "1 node: busy (0 of 1 GPUs free, needs 1)"


def test_backfill_a_big_job_that_cannot_start_does_not_block_small_ones() -> None:
    index = PlacementIndex([node("a", gpus=4, free=2)])
    r = plan([wait("big", 1000, count=4), wait("small", 2000)], index, now_ms=3000)
    assert placed(r) == [("small", "a")]
    assert [w.req.job_id for w in r.waiting] == ["big"]


def test_a_starving_job_holds_the_node_it_is_closest_to_fitting() -> None:
    # "big" has waited 10 minutes for 4 GPUs; node b has 3 free, node a 1.
    index = PlacementIndex([node("a", gpus=4, free=1), node("b", gpus=4, free=3)])
    now = 20 * MIN
    r = plan(
        [wait("big", now - 10 * MIN, count=4), wait("s1", now - MIN), wait("s2", now - MIN)],
        index,
        now_ms=now,
        starve_after_ms=5 * MIN,
    )
    assert r.holds == {"b": "big"}
    assert placed(r) == [("s1", "a")]  # backfill still uses the node that is not held
    assert "held for an older waiting job" in r.reasons[("s2", 0)].explain()


def test_without_holds_small_jobs_would_starve_the_big_one_forever() -> None:
    """Each time one GPU frees, a small job takes it: with holds the big job gets the node."""
    nodes = [node("a", gpus=4, free=0)]
    for starve_after, expect_big in ((10**12, False), (5 * MIN, True)):
        index = PlacementIndex(nodes)
        now = 10 * MIN
        big = wait("big", 0, count=4)
        got_big = False
        for step in range(4):  # the four running GPUs end one by one
            n = index.nodes["a"]
            index.upsert(replace(n, free_indices=(*n.free_indices, step)))
            smalls = [wait(f"s{step}", now - MIN)]
            r = plan([big, *smalls], index, now_ms=now, starve_after_ms=starve_after)
            got_big = got_big or any(w.req.job_id == "big" for w, _ in r.placed)
        assert got_big is expect_big


def test_a_failed_shape_is_not_searched_again_in_the_pass() -> None:
    index = PlacementIndex([node("a", gpus=1, free=0)])
    waiting = [wait(f"j{i}", 1000 + i) for i in range(1000)]
    r = plan(waiting, index, now_ms=5000)
    assert not r.placed and len(r.waiting) == 1000
    assert all(v.explain().startswith("1 node: busy") for v in r.reasons.values())


def test_multi_worker_jobs_place_each_worker_as_capacity_allows() -> None:
    index = PlacementIndex([node("a", gpus=2), node("b", gpus=1)])
    workers = [wait("train", 1000, worker=i) for i in range(4)]
    r = plan(workers, index, now_ms=2000)
    assert sorted(w.req.worker for w, _ in r.placed) == [0, 1, 2]
    assert [w.req.worker for w in r.waiting] == [3]


def test_a_pass_decides_what_the_linear_scan_decides_in_order() -> None:
    """The pass (index, failed shapes, failure memo) against `place` one worker at a time."""
    import random

    from gpufleet_scheduler.placement import Placement, place

    from .test_placement import random_fleet, random_request

    rng = random.Random(3)
    for _ in range(20):
        fleet = random_fleet(rng, rng.randint(5, 40))
        reqs = [random_request(rng, i) for i in range(60)]
        r = plan(
            [Waiting(req=q, queued_ms=i) for i, q in enumerate(reqs)], PlacementIndex(fleet), 100
        )
        got = {w.req.job_id: (p.node.node_id, p.gpu_indices) for w, p in r.placed}
        ref = PlacementIndex(fleet)
        for q in reqs:
            d = place(q, list(ref.nodes.values()))
            if isinstance(d, Placement):
                ref.take(d)
                assert got.get(q.job_id) == (d.node.node_id, d.gpu_indices)
            else:
                assert q.job_id not in got


def test_explanations_rotate_over_shapes_beyond_the_budget() -> None:
    """Five request shapes (GPU counts 1..5 on a full node), two explained a pass: those
    never explained first, oldest job first; then those explained longest ago."""
    index = PlacementIndex([node("a", gpus=8, free=0)])
    waiting = [wait(f"j{n}", 1000 + n, count=n) for n in range(1, 6)]
    explained: dict[tuple[object, ...], int] = {}

    def explained_jobs(pass_no: int, ws: list[Waiting]) -> list[str]:
        r = plan(ws, index, now_ms=5000, explain_budget=2, explained=explained, pass_no=pass_no)
        return sorted(job for job, _ in r.reasons)

    assert explained_jobs(0, waiting) == ["j1", "j2"]
    assert explained_jobs(1, waiting) == ["j3", "j4"]
    r = plan(waiting, index, now_ms=5000, explain_budget=2, explained=explained, pass_no=2)
    assert sorted(job for job, _ in r.reasons) == ["j1", "j5"] and r.never_explained == 0
    assert explained_jobs(3, waiting) == ["j2", "j3"]  # explained longest ago
    # A shape nothing waits with any more is forgotten.
    assert explained_jobs(4, waiting[1:]) == ["j4", "j5"]
    assert len(explained) == 4


def test_shapes_over_the_budget_are_counted_as_never_explained() -> None:
    index = PlacementIndex([node("a", gpus=8, free=0)])
    waiting = [wait(f"j{n}", 1000 + n, count=n) for n in range(1, 6)]
    r = plan(waiting, index, now_ms=5000, explain_budget=2, explained={})
    assert r.never_explained == 3 and len(r.reasons) == 2
