"""Notebooks (R-JOB-1): the token that opens a notebook's JupyterLab, made at submission and
given back to the job's creator only (rpc.scheduler.open_notebook.<account>).

The token is one of the job's env values (`NOTEBOOK_TOKEN_ENV`): stored sealed with the
scheduler's key (`env_sealed`, jobrequest.py), "<secret>" in the stored spec, every event and
every reply but `NotebookAccess`, and sealed to the node with the worker's other env values
(placing.py), where JupyterLab reads it. Its owner account, when the job is federated, sees
the job and its URL but never the token: whoever holds it acts in the notebook as its
creator.
"""

from __future__ import annotations

import logging
import secrets

from gpufleet_contracts import field_errors, limits
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.jobs import JobSpec, JobState, JobType
from gpufleet_contracts.serving import (
    NOTEBOOK_TOKEN_BYTES,
    NOTEBOOK_TOKEN_ENV,
    ColdStartPhase,
    NotebookAccess,
    OpenNotebook,
)
from gpufleet_store import Doc
from pydantic import ValidationError

from . import jobrequest, serving
from .state import State

log = logging.getLogger("gpufleet.scheduler.notebooks")


def with_token(spec: JobSpec) -> JobSpec:
    """A notebook's spec with its new random token in its env; any other spec as it is.
    Refused: the notebook's env names the token itself, or the spec has no room left for it
    (validated again: its stored form is, each time it is read back)."""
    if spec.type is not JobType.notebook:
        return spec
    if NOTEBOOK_TOKEN_ENV in spec.env:
        raise _env_refused(
            f"{NOTEBOOK_TOKEN_ENV} is set by gpufleet: a notebook's token is made at submission",
            f"an env without {NOTEBOOK_TOKEN_ENV} (`gpufleet job open` gives the token)",
        )
    if len(spec.env) >= limits.ENV_VARS:
        raise _env_refused(
            f"a notebook has room for {limits.ENV_VARS - 1} env values: gpufleet sets "
            f"{NOTEBOOK_TOKEN_ENV}",
            f"at most {limits.ENV_VARS - 1} env values",
        )
    token = secrets.token_urlsafe(NOTEBOOK_TOKEN_BYTES)
    given = spec.model_dump(mode="json", exclude_defaults=True)
    given["env"] = {**spec.env, NOTEBOOK_TOKEN_ENV: token}
    try:
        return JobSpec.model_validate(given)
    except ValidationError as exc:
        fields = [
            f.model_copy(update={"field": "spec" if f.field == "(message)" else f"spec.{f.field}"})
            for f in field_errors(exc, JobSpec)
        ]
        raise Refused(
            "invalid", "the notebook's spec has no room left for its token", fields
        ) from None


def _env_refused(message: str, valid: str) -> Refused:
    return Refused.of_field(
        "invalid", message, field="spec.env", rule="R-JOB-1", says=message, valid=valid
    )


def access(job: Doc, token: str) -> NotebookAccess:
    """The notebook's URL (ending with `/`, so `<url>lab?token=<token>` opens it) and whether
    it answers; Refused while it has no URL, saying why."""
    workers = job["workers"]
    shown = serving.job_view(workers)["url"]
    if not shown:
        raise Refused("conflict", _no_url(job))
    answered = any(
        serving.url(w) and ColdStartPhase.first_answer.value in (w.get("endpoint_phases") or {})
        for w in workers
    )
    return NotebookAccess(
        job_id=job["_id"], url=shown.rstrip("/") + "/", token=token, ready=answered
    )


def _no_url(job: Doc) -> str:
    """Why a notebook has no URL (yet): as `gpufleet job open` says it of an endpoint."""
    name, state = job["_id"], job["state"]
    if JobState(state).terminal:
        return f"notebook {name} has ended ({state}): its URL is closed"
    if any(w.get("minion_id") for w in job["workers"]):
        return f"notebook {name} runs on a node whose agent serves no URL (it has no proxy)"
    return (
        f"notebook {name} is not running yet ({state}): it has a URL once a node takes it; "
        "try again in a moment (`gpufleet job show` says why it waits)"
    )


def _not_notebook(job_id: str) -> Refused:
    return Refused.of_field(
        "invalid",
        f"job {job_id} is not a notebook: it has no token",
        field="job_id",
        rule="R-JOB-1",
        says=f"job {job_id} is not a notebook",
        valid="the id of one of your notebook jobs (type: notebook)",
    )


class Notebooks:
    def __init__(self, state: State) -> None:
        self.state = state

    async def open(self, body: OpenNotebook, account: str) -> NotebookAccess:
        """The URL and token of a notebook `account` created; its project's owner, as every
        other account, is answered "not found"."""
        job = await self.state.find_job(body.job_id, account)
        if job.get("creator") != account:
            raise NotFound(f"job {body.job_id} not found")
        if self.state.request(job).type is not JobType.notebook:
            raise _not_notebook(body.job_id)
        token = jobrequest.env_of(job, self.state.box).get(NOTEBOOK_TOKEN_ENV)
        if not token:  # stored before notebooks had tokens
            raise Refused("conflict", f"notebook {body.job_id} has no token: submit it again")
        opened = access(job, token)
        log.info("account %s opened notebook %s", account, body.job_id)
        return opened
