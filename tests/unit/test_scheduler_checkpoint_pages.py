"""Checkpoint pages (services/scheduler/.../checkpoint.py): pure encoding, no database."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet_scheduler import checkpoint


def test_pages_round_trip_and_keep_only_what_placement_needs() -> None:
    at = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    job = {
        "_id": "j1",
        "owner": "acme",
        "state": "running",
        "version": 3,
        "queued_at": at,
        "spec": {"env": {"BIG": "x" * 1000}},
        "history": [{"state": "queued", "at": at}],
        "req": {"gpu_types": ["T4"], "gpu_count": 1},
        "workers": [{"index": 0, "state": "running", "started_at": at, "log_tail": "..."}],
    }
    pages = checkpoint.encode(7, [{"_id": "n1", "region": "eu"}], [job])
    cp = checkpoint.decode(pages)
    assert cp.rev == 7 and cp.nodes == [{"_id": "n1", "region": "eu"}]
    (j,) = cp.jobs
    assert j["queued_at"] == at and j["workers"][0]["started_at"] == at
    assert "spec" not in j and "history" not in j and "log_tail" not in j["workers"][0]
    assert j["partial"] is True
