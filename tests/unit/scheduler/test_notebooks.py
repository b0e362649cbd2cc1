"""Notebooks in the scheduler (R-JOB-1), from plain specs and job documents: a notebook is
served like an endpoint (JupyterLab probed on its API), gets a random token in its env at
submission (sealed at rest as every env value, "<secret>" wherever it is shown), and its
URL is answered with its token only once it has one."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gpufleet_contracts import limits
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.jobs import JobSpec, JobView
from gpufleet_contracts.secrets import REDACTED
from gpufleet_contracts.serving import (
    NOTEBOOK_HEALTH_PATH,
    NOTEBOOK_TOKEN_ENV,
    ColdStartPhase,
    EndpointReady,
    PhaseAt,
    ServingKind,
)
from gpufleet_scheduler import jobdoc, jobrequest, notebooks, reports, serving
from gpufleet_store import SecretBox

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
BASE: dict[str, Any] = {"name": "nb", "gpu_types": ["RTX 3090"], "type": "notebook"}
JOB_ID = "j0123abcdef45"


def spec(**kw: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, **kw})


def test_a_notebook_is_served_and_probed_on_jupyters_api() -> None:
    served = serving.serving_for(spec())
    assert served is not None
    assert (served.kind, served.health_path) == (ServingKind.notebook, NOTEBOOK_HEALTH_PATH)
    assert served.routes == []
    assert serving.serving_for(spec(command=["python", "app.py"])) == served


def test_a_notebook_gets_a_random_token_in_its_env_which_makes_it_carry_secrets() -> None:
    plain = spec(env={"A": "1"})
    assert not jobrequest.carries_secrets(spec())
    given = notebooks.with_token(plain)
    token = given.env[NOTEBOOK_TOKEN_ENV]
    assert len(token) == 43 and given.env["A"] == "1"  # 32 random bytes, url-safe
    assert notebooks.with_token(plain).env[NOTEBOOK_TOKEN_ENV] != token
    assert NOTEBOOK_TOKEN_ENV not in plain.env  # the submitted spec is left as it was
    assert jobrequest.carries_secrets(given)  # only a node with a sealing key takes it
    training = JobSpec.model_validate({**BASE, "type": "training", "command": ["true"]})
    assert notebooks.with_token(training) is training


@pytest.mark.parametrize(
    "env",
    [
        {NOTEBOOK_TOKEN_ENV: "mine"},
        {f"V{i}": "x" for i in range(limits.ENV_VARS)},
    ],
)
def test_a_notebook_may_not_set_its_own_token(env: dict[str, str]) -> None:
    with pytest.raises(Refused) as exc:
        notebooks.with_token(spec(env=env))
    (field,) = exc.value.fields
    assert (field.field, field.rule) == ("spec.env", "R-JOB-1")
    assert NOTEBOOK_TOKEN_ENV in exc.value.message
    assert "mine" not in json.dumps(exc.value.reply.model_dump(mode="json"))


def test_a_notebook_with_no_room_left_for_its_token_is_refused_at_submission() -> None:
    """Its stored form is validated each time it is read back: it must fit with the token."""
    env = {f"V{i}": "x" * limits.ENV_VALUE_CHARS for i in range(15)}
    full = spec(env=env)
    size = len(full.model_dump_json())
    env["PAD"] = "x" * (limits.SPEC_BYTES - size - 20)  # fits alone, not with the token
    with pytest.raises(Refused) as exc:
        notebooks.with_token(spec(env=env))
    assert exc.value.code == "invalid" and "no room" in exc.value.message
    assert [(f.field, f.rule) for f in exc.value.fields] == [("spec", "limit:spec_bytes")]


def notebook_doc(box: SecretBox, url: str | None = "http://{job}.n0:8480") -> dict[str, Any]:
    given = notebooks.with_token(spec())
    doc = jobdoc.new_job(JOB_ID, given, "acme", T0, None, box=box)
    doc["state"] = "running"
    doc["workers"] = [
        {
            "index": 0,
            "state": "running",
            "placement_id": "p0",
            "minion_id": "node-0",
            "placed_at": T0,
            "url": serving.url_of(url, JOB_ID),
            "attempts": [],
        }
    ]
    return doc


def test_the_token_is_sealed_at_rest_and_shown_as_secret() -> None:
    box = SecretBox.for_process()
    doc = notebook_doc(box)
    token = jobrequest.env_of(doc, box)[NOTEBOOK_TOKEN_ENV]
    assert doc["spec"]["env"] == {NOTEBOOK_TOKEN_ENV: REDACTED}
    assert token not in json.dumps(doc, default=str).replace(doc["env_sealed"], "")
    assert doc["req"]["secrets"] is True and doc["req"]["type"] == "notebook"
    view = JobView.model_validate(jobdoc.view(doc))
    assert token not in view.model_dump_json()
    assert jobrequest.spec_of(doc, box).env[NOTEBOOK_TOKEN_ENV] == token


def test_a_notebook_is_starting_until_it_answers_then_its_access_is_ready() -> None:
    box = SecretBox.for_process()
    doc = notebook_doc(box)
    waiting = JobView.model_validate(jobdoc.view(doc))
    assert (waiting.state, waiting.progress) == ("starting", serving.AWAITING)
    assert waiting.url == f"http://{JOB_ID}.n0:8480"
    opened = notebooks.access(doc, "tok")
    assert (opened.url, opened.token, opened.ready) == (f"http://{JOB_ID}.n0:8480/", "tok", False)
    assert "tok" not in repr(opened)
    ready = EndpointReady(
        job_id=JOB_ID,
        worker=0,
        placement_id="p0",
        minion_id="node-0",
        url=f"http://{JOB_ID}.n0:8480",
        phases=[PhaseAt(phase=ColdStartPhase.first_answer, at=T0 + timedelta(seconds=3))],
    )
    assert reports.shown(doc, ready)
    assert JobView.model_validate(jobdoc.view(doc)).state == "running"
    assert notebooks.access(doc, "tok").ready


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"state": "queued", "workers": [{"index": 0, "state": "waiting"}]}, "not running yet"),
        ({"state": "stopped", "workers": [{"index": 0, "state": "stopped"}]}, "has ended"),
        ({}, "serves no URL"),
    ],
)
def test_a_notebook_without_a_url_says_why(change: dict[str, Any], why: str) -> None:
    doc = {**notebook_doc(SecretBox.for_process(), url=None), **change}
    with pytest.raises(Refused) as exc:
        notebooks.access(doc, "tok")
    assert why in exc.value.message and "tok" not in exc.value.message
