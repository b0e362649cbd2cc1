"""Checkpoint pages (services/scheduler/.../checkpoint.py): pure encoding, no database."""

from __future__ import annotations

import asyncio
import zlib
from datetime import UTC, datetime

import bson
import pytest
from gpufleet_scheduler import checkpoint


async def test_pages_round_trip_and_keep_only_what_placement_needs() -> None:
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
    pages = await checkpoint.encode(7, [{"_id": "n1", "region": "eu"}], [job])
    cp = checkpoint.decode(pages)
    assert cp.rev == 7 and cp.nodes == [{"_id": "n1", "region": "eu"}]
    (j,) = cp.jobs
    assert j["queued_at"] == at and j["workers"][0]["started_at"] == at
    assert "spec" not in j and "history" not in j and "log_tail" not in j["workers"][0]
    assert j["partial"] is True


async def test_jobs_encoded_in_parts_decode_whole_and_so_does_the_earlier_format() -> None:
    jobs = [{"_id": f"j{i}", "state": "queued", "workers": []} for i in range(4_500)]
    pages = await checkpoint.encode(3, [], jobs)
    cp = checkpoint.decode(pages)
    assert cp.rev == 3 and [j["_id"] for j in cp.jobs] == [j["_id"] for j in jobs]

    # One document holding rev, nodes and jobs: what checkpoints were before parts.
    old = zlib.compress(bson.encode({"rev": 9, "nodes": [{"_id": "n1"}], "jobs": jobs[:2]}))
    cp = checkpoint.decode([old])
    assert cp.rev == 9 and cp.nodes == [{"_id": "n1"}] and len(cp.jobs) == 2


async def test_a_job_changed_after_its_part_was_encoded_keeps_what_was_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between parts the service runs on and may replace a job already taken: the
    checkpoint holds it as it was when its part was encoded."""
    monkeypatch.setattr(checkpoint, "PART_JOBS", 1)
    job = {"_id": "j1", "state": "queued", "workers": [{"index": 0, "state": "waiting"}]}
    other = {"_id": "j2", "state": "queued", "workers": []}
    encoding = asyncio.ensure_future(checkpoint.encode(1, [], [job, other]))
    await asyncio.sleep(0)  # encode runs up to its pause before the first part
    await asyncio.sleep(0)  # it encodes the first part (j1) and pauses again
    job["workers"][0]["state"] = "placed"
    job["state"] = "starting"
    j1, j2 = checkpoint.decode(await encoding).jobs
    assert j1["state"] == "queued" and j1["workers"][0]["state"] == "waiting"
    assert j2["_id"] == "j2"
