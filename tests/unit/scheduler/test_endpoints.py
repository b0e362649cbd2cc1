"""Endpoints in the scheduler (R-JOB-6): the keys it makes and checks, what a worker of each
kind of endpoint serves, its URL on its node's proxy, and what its node says of it shown on
the job (cold start, requests) from plain job documents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gpufleet_contracts import field_errors
from gpufleet_contracts.jobs import JobSpec, JobView
from gpufleet_contracts.serving import (
    KEY_RE,
    ROUTES_HEALTH_PATH,
    ColdStartPhase,
    EndpointKeyCreated,
    EndpointMetered,
    EndpointReady,
    PhaseAt,
    ServingKind,
    key_digest,
    parse_key,
)
from gpufleet_scheduler import jobdoc, reports, serving
from gpufleet_scheduler.endpointkeys import new_key, verdict, view
from pydantic import ValidationError

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
ROUTE = {"path": "/sum", "file": "app.py", "function": "add", "body": []}
BASE: dict[str, Any] = {"name": "ep", "gpu_types": ["RTX 3090"], "type": "endpoint"}


MODEL = {"source": "git", "path": "https://git.example/model.git"}  # the routes' files


def spec(**endpoint: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, "model": MODEL, "endpoint": endpoint})


# --- keys -------------------------------------------------------------------------------


def test_a_key_is_gfk_its_id_and_a_43_character_secret_and_only_its_digest_is_kept() -> None:
    key_id, secret, key = new_key()
    assert KEY_RE.match(key) and key == f"gfk_{key_id}_{secret}"
    assert len(key_id) == 12 and len(secret) == 43
    assert parse_key(key) == (key_id, secret)
    assert parse_key(key + "x") is None and parse_key(key.replace("gfk_", "gfx_")) is None
    assert new_key()[0] != key_id  # random, each time
    digest = key_digest(secret)
    assert len(digest) == 64 and secret not in digest
    doc = {"_id": key_id, "job_id": "j1", "digest": digest, "live": True, "created_ms": 1}
    shown = EndpointKeyCreated(view=view(doc), key=key).view.model_dump_json()
    assert secret not in shown and digest not in shown


def test_a_key_opens_its_own_endpoint_only_while_live() -> None:
    _, secret, _ = new_key()
    doc = {"_id": "k", "job_id": "j1", "digest": key_digest(secret), "live": True}
    assert verdict(doc, "j1", key_digest(secret)).verdict == "open"
    assert verdict(doc, "j2", key_digest(secret)).verdict == "elsewhere"
    assert verdict(doc, "j1", key_digest(secret + "x")).verdict == "unknown"
    assert verdict(doc, "j2", key_digest(secret + "x")).verdict == "unknown"
    assert verdict(None, "j1", key_digest(secret)).verdict == "unknown"
    revoked = {**doc, "live": 0, "revoked_ms": 1}  # as nx-27017 keeps a $set False
    assert verdict(revoked, "j1", key_digest(secret)).verdict == "unknown"


# --- what a worker serves ---------------------------------------------------------------


def test_routes_are_served_by_the_route_server_probed_on_its_health_route() -> None:
    got = serving.serving_for(spec(routes=[ROUTE, {**ROUTE, "path": "/mul"}]))
    assert got is not None and got.kind is ServingKind.routes
    assert [r.path for r in got.routes] == ["/sum", "/mul"]
    assert got.health_path == ROUTES_HEALTH_PATH


def test_a_manual_server_is_probed_on_slash_or_its_declared_path() -> None:
    plain = serving.serving_for(spec(server_command=["python3", "-m", "http.server", "80"]))
    assert plain is not None and (plain.kind, plain.routes, plain.health_path) == (
        ServingKind.server,
        [],
        "/",
    )
    declared = serving.serving_for(spec(server_command=["srv"], health_path="/healthz"))
    assert declared is not None and declared.health_path == "/healthz"


def test_other_job_types_serve_nothing() -> None:
    training = JobSpec.model_validate({**BASE, "type": "training", "command": ["true"]})
    assert serving.serving_for(training) is None


@pytest.mark.parametrize(
    "endpoint",
    [
        {"routes": [ROUTE], "health_path": "/healthz"},  # routes have their own
        {"server_command": ["srv"], "health_path": "healthz"},  # not a path
        {"server_command": ["srv"], "health_path": "/a b"},
    ],
)
def test_a_health_path_is_a_manual_servers_path(endpoint: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(**endpoint)
    refused = [(e.field, e.rule) for e in field_errors(exc.value, JobSpec)]
    assert refused[0][0].startswith("endpoint") and refused[0][1] == "R-JOB-6", refused


def test_the_url_is_the_proxys_template_with_the_job_id() -> None:
    assert serving.url_of("http://{job}.localhost:8480", "j0123abcdef45") == (
        "http://j0123abcdef45.localhost:8480"
    )
    assert serving.url_of("https://gw.example/{job}/", "JAB") == "https://gw.example/jab/"
    assert serving.url_of(None, "j1") is None


# --- what its node says of it, shown on the job -----------------------------------------


def job(workers: int = 1) -> dict[str, Any]:
    doc = jobdoc.new_job("j0123abcdef45", spec(routes=[ROUTE]), "acme", T0, None)
    doc["workers"] = doc["workers"][:0] + [
        {
            "index": i,
            "state": "running",
            "placement_id": f"p{i}",
            "minion_id": f"node-{i}",
            "placed_at": T0,
            "url": serving.url_of(f"http://{{job}}.n{i}:8480", doc["_id"]),
            "attempts": [],
        }
        for i in range(workers)
    ]
    return doc


def ready(worker: int = 0, minion: str = "node-0", **kw: Any) -> EndpointReady:
    phases = [
        PhaseAt(phase=ColdStartPhase.image_ready, at=T0 + timedelta(seconds=1)),
        PhaseAt(phase=ColdStartPhase.process_started, at=T0 + timedelta(seconds=2)),
        PhaseAt(phase=ColdStartPhase.first_answer, at=T0 + timedelta(seconds=2.5)),
    ]
    body = {
        "job_id": "j0123abcdef45",
        "worker": worker,
        "placement_id": f"p{worker}",
        "minion_id": minion,
        "url": f"http://j0123abcdef45.n{worker}:8480",
        "phases": phases,
    }
    return EndpointReady.model_validate({**body, **kw})


def metered(at_s: float, requests: int, worker: int = 0, **kw: Any) -> EndpointMetered:
    return EndpointMetered(
        job_id="j0123abcdef45",
        worker=worker,
        placement_id=kw.pop("placement_id", f"p{worker}"),
        minion_id=f"node-{worker}",
        at=T0 + timedelta(seconds=at_s),
        requests=requests,
        errors=kw.pop("errors", 0),
        bytes_in=requests * 10,
        bytes_out=requests * 100,
    )


def shown(doc: dict[str, Any]) -> JobView:
    return JobView.model_validate(jobdoc.view(doc))


def test_an_endpoint_shows_its_url_cold_start_and_request_totals() -> None:
    doc = job(workers=2)
    before = shown(doc)
    assert before.url == "http://j0123abcdef45.n0:8480" and before.cold_start == {}
    assert before.requests is None and before.workers[1].url == "http://j0123abcdef45.n1:8480"

    assert reports.shown(doc, ready())
    assert not reports.shown(doc, ready())  # the same again: nothing to write
    assert reports.shown(doc, metered(5, 3))
    assert reports.shown(doc, metered(9, 7, errors=1))
    assert not reports.shown(doc, metered(9, 7, errors=1))  # repeated: totals, no sum
    assert not reports.shown(doc, metered(6, 4))  # older than the one kept
    assert reports.shown(doc, metered(4, 2, worker=1))
    view = shown(doc)
    assert view.cold_start == {
        "placed": 0.0,
        "image_ready": 1.0,
        "process_started": 2.0,
        "first_answer": 2.5,
    }
    assert (view.requests, view.errors, view.bytes_in, view.bytes_out) == (9, 1, 90, 900)
    assert (view.workers[0].requests, view.workers[1].requests) == (7, 2)
    assert view.workers[1].cold_start == {}


def test_the_cold_start_is_shown_in_the_order_its_phases_ended() -> None:
    """Data is staged before the image is built (a model's requirements.txt goes into it)."""
    placed = datetime(2026, 1, 1, tzinfo=UTC)
    w = {
        "placed_at": placed,
        "endpoint_phases": {
            "image_ready": placed + timedelta(seconds=4),
            "data_staged": placed + timedelta(seconds=1),
            "process_started": placed + timedelta(seconds=5),
            "first_answer": placed + timedelta(seconds=6),
        },
    }
    assert list(serving.cold_start(w)) == [
        "placed",
        "data_staged",
        "image_ready",
        "process_started",
        "first_answer",
    ]


def test_only_the_node_holding_the_placement_is_heard_and_an_ended_worker_has_no_url() -> None:
    doc = job()
    assert not reports.shown(doc, ready(minion="node-9"))  # another node (apply drops it too)
    assert not reports.shown(doc, ready(placement_id="p-old"))
    assert shown(doc).cold_start == {}
    # its last count comes after its end; its URL is closed
    doc["workers"][0]["state"] = "finished"
    assert not reports.shown(doc, ready())
    assert reports.shown(doc, metered(30, 11))
    view = shown(doc)
    assert view.url is None and view.workers[0].url is None and view.requests == 11


def test_other_jobs_show_no_endpoint_fields() -> None:
    training = JobSpec.model_validate({**BASE, "type": "training", "command": ["true"]})
    doc = jobdoc.new_job("j1", training, "a", T0, None)
    view = shown(doc)
    assert (view.url, view.cold_start, view.requests, view.bytes_out) == (None, {}, None, None)


def test_an_endpoint_is_running_to_users_only_once_it_answered_through_its_url() -> None:
    doc = job(workers=2)
    doc["state"] = "running"
    waiting = shown(doc)
    assert waiting.state == "starting" and waiting.progress == serving.AWAITING
    assert waiting.url == "http://j0123abcdef45.n0:8480"  # requests to it are held meanwhile
    assert reports.shown(doc, ready(worker=1, minion="node-1"))  # one worker answers
    assert (shown(doc).state, shown(doc).progress) == ("running", None)
    doc["workers"][1]["state"] = "finished"  # the one that answered ended
    assert shown(doc).state == "starting"
    doc["workers"][0]["url"] = None  # a node whose agent serves no URL: nothing to wait for
    assert shown(doc).state == "running"
