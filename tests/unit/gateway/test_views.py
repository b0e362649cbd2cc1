"""The console's views: queue positions and queued times, the fleet by region and node."""

from __future__ import annotations

import base64
from typing import Any

from gpufleet_contracts.jobviews import JobLogs, JobView, LogChunk
from gpufleet_contracts.nodes import NodeView
from gpufleet_gateway import views


def job(job_id: str, state: str, queued_at: str | None = None, **extra: Any) -> JobView:
    return JobView.model_validate(
        {
            "id": job_id,
            "name": job_id,
            "project": "default",
            "owner": "acme",
            "creator": "acme",
            "state": state,
            "spec": {},
            "history": [],
            "notes": [],
            "workers": [],
            "queued_at": queued_at,
            **extra,
        }
    )


def node(name: str, region: str, **telemetry: Any) -> NodeView:
    return NodeView.model_validate(
        {
            "node_id": f"n-{name}",
            "minion_id": name,
            "name": name,
            "region": region,
            "owner": "acme",
            "state": "active",
            "kind": "compute",
            "provider": "physical",
            "gpus": [
                {"index": 0, "uuid": "GPU-0", "model": "RTX 3090", "nvml_name": "x", "memory_mb": 1}
            ],
            "simulated": True,
            "inventory_source": "simulated",
            "failed_rules": [],
            "last_seen": "2026-11-27T11:59:59+00:00",
            "telemetry": telemetry or None,
        }
    )


def test_waiting_jobs_are_numbered_oldest_first_with_their_reason_and_queued_time() -> None:
    jobs = [
        job("late", "queued", "2026-11-27T11:59:00+00:00", queue_reason="busy"),
        job("runs", "running"),
        job("early", "queued", "2026-11-27T11:50:00", queue_reason="no node has 8 GPUs"),
        job("done", "finished"),
    ]
    queue = views.queue(jobs)
    assert [(r.position, r.id, r.reason) for r in queue.queued] == [
        (1, "early", "no node has 8 GPUs"),
        (2, "late", "busy"),
    ]
    # the browser counts each wait from it: with its offset, a naive time being UTC
    assert [r.queued_at for r in queue.queued] == [
        "2026-11-27T11:50:00+00:00",
        "2026-11-27T11:59:00+00:00",
    ]
    assert [r.id for r in queue.running] == ["runs"]
    assert [r.id for r in queue.recent] == ["done"]


def test_the_fleet_groups_nodes_by_region_and_narrows_to_one_region_or_node() -> None:
    gpu = {"index": 0, "utilization_pct": 40, "temperature_c": 61, "memory_used_mb": 100}
    nodes = [
        node("b1", "west", cpu_pct=12.5, gpus=[gpu], disk_used_pct=50.0, running=["j/0"]),
        node("a1", "east", gpus=[{**gpu, "utilization_pct": 80}]),
        node("a2", "east"),
    ]
    whole = views.fleet(nodes)
    assert [(g.region, [n.name for n in g.nodes]) for g in whole.regions] == [
        ("east", ["a1", "a2"]),
        ("west", ["b1"]),
    ]
    assert (whole.nodes, whole.gpus) == (3, 3)
    assert whole.regions[0].gpu_utilization_pct == 80.0  # only GPUs that reported one
    west = views.fleet(nodes, region="west").regions[0].nodes[0]
    assert (west.cpu_pct, west.disk_used_pct, west.running) == (12.5, 50.0, ["j/0"])
    assert west.gpus[0].temperature_c == 61
    assert [g.region for g in views.fleet(nodes, node="a2").regions] == ["east"]


def test_a_jobs_log_tail_is_its_chunks_decoded_and_cut() -> None:
    chunk = LogChunk(
        subject="s", worker="0", seq=1, time="t", data=base64.b64encode(b"x" * 9000).decode()
    )
    logs = JobLogs(job_id="j", chunks=[chunk], last_seq=1, more=False)
    page = views.job_page(job("j", "running"), logs)
    assert len(page.log_tail) == views.LOG_TAIL_CHARS and page.log_truncated
