"""Checkpoint pages (services/scheduler/.../checkpoint.py): pure encoding, no database."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime

import bson
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


def test_jobs_encoded_in_parts_decode_whole_and_so_does_the_earlier_format() -> None:
    jobs = [{"_id": f"j{i}", "state": "queued", "workers": []} for i in range(4_500)]
    pages = checkpoint.encode(3, [], jobs)
    cp = checkpoint.decode(pages)
    assert cp.rev == 3 and [j["_id"] for j in cp.jobs] == [j["_id"] for j in jobs]

    # One document holding rev, nodes and jobs: what checkpoints were before parts.
    old = zlib.compress(bson.encode({"rev": 9, "nodes": [{"_id": "n1"}], "jobs": jobs[:2]}))
    cp = checkpoint.decode([old])
    assert cp.rev == 9 and cp.nodes == [{"_id": "n1"}] and len(cp.jobs) == 2


def test_a_job_replaced_after_it_was_added_keeps_what_was_taken() -> None:
    job = {"_id": "j1", "state": "queued", "workers": [{"index": 0, "state": "waiting"}]}
    enc = checkpoint.Encoder(1, [])
    enc.add([job])
    job["workers"][0]["state"] = "placed"
    job["state"] = "starting"
    (j,) = checkpoint.decode(enc.pages()).jobs
    assert j["state"] == "queued" and j["workers"][0]["state"] == "waiting"
