"""Which node may state a worker's fact (gpufleet_scheduler.reports.placed_on): the node of
its placement, now or in an earlier attempt; any other fact is of a worker it never ran."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_contracts.jobs import WorkerFinished, WorkerStarted, WorkerState
from gpufleet_scheduler.reports import placed_on

NOW = datetime.now(UTC)


def job(**worker: Any) -> dict[str, Any]:
    return {"_id": "j", "workers": [{"index": 0, **worker}]}


def started(minion: str, placement: str = "p2", worker: int = 0) -> WorkerStarted:
    return WorkerStarted(
        job_id="j", worker=worker, placement_id=placement, minion_id=minion, started_at=NOW
    )


RAN = job(
    placement_id="p2",
    minion_id="a",
    attempts=[{"placement_id": "p1", "minion_id": "b"}],
)


@pytest.mark.parametrize(
    ("evt", "ok"),
    [
        (started("a"), True),  # its placement
        (started("b", "p1"), True),  # an earlier one of its (stale, not forged)
        (started("b"), False),  # another node's placement
        (started("a", "p1"), False),  # an earlier placement, not this node's
        (started("a", "p9"), False),  # a placement that never was
        (started("a", worker=1), False),  # a worker the job does not have
    ],
)
def test_only_the_node_a_placement_named_states_its_facts(evt: WorkerStarted, ok: bool) -> None:
    assert placed_on(RAN, evt) is ok


def test_a_fact_about_no_job_is_no_nodes() -> None:
    end = WorkerFinished(
        job_id="j", worker=0, placement_id="p2", minion_id="a", state=WorkerState.failed,
        ended_at=NOW,
    )  # fmt: skip
    assert placed_on(None, end) is False
    assert placed_on(job(state="waiting"), end) is False
