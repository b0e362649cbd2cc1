"""Attack: getting another account's notebook token (R-JOB-1) from the scheduler:
open_notebook on the attacker's own subject (answered as for a job that does not exist),
on the victim's subject (which the server does not let the attacker publish), and a
notebook submitted with a token of the attacker's choosing (refused).

On the real servers (NATS with its permissions, nx-27017) with the scheduler in-process, as
tests/integration/scheduler/test_notebooks.py runs it. The proxy's side is
test_notebook_proxy.py.
"""

from __future__ import annotations

import nats
import pytest
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import SubmitJob
from gpufleet_contracts.serving import NOTEBOOK_TOKEN_ENV, OpenNotebook
from integration.conftest import connect
from integration.scheduler.test_endpoints import PROXY
from integration.scheduler.test_fleet import Sys, known, registered
from integration.scheduler.test_fleet import system as system  # the fixture
from integration.scheduler.test_notebooks import notebook_spec, open_as

ATTACKER = "mallory"


async def test_another_account_gets_no_token_of_a_notebook(system: Sys) -> None:
    s = system
    await s.node(registered("a", gpus=1, sealing=True).model_copy(update={"proxy_url": PROXY}))
    await known(s, "a")
    submitted = await s.call(SubmitJob.SUBJECT, SubmitJob(spec=notebook_spec()).to_bytes())
    job_id = submitted["id"]
    mine = await open_as(s, job_id)
    assert mine["token"], mine
    theirs = await open_as(s, job_id, ATTACKER)
    missing = await open_as(s, "j000000000000", ATTACKER)
    assert theirs["error"]["code"] == "not_found"
    # as for a job that does not exist: nothing says this one does
    assert theirs["error"] == {
        **missing["error"],
        "message": missing["error"]["message"].replace("j000000000000", job_id),
    }
    assert mine["token"] not in str(theirs)

    # the victim's subject: the server does not let the attacker's user publish it
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    user = await connect(
        s.server, s.server.creds("user", "eve", account=ATTACKER), error_cb=on_error
    )
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await user.request(
                subjects.as_account(OpenNotebook.SUBJECT, "local"),
                OpenNotebook(job_id=job_id).to_bytes(),
                timeout=1,
            )
    finally:
        await user.close()
    assert any("permissions violation" in str(e).lower() for e in errors)


async def test_a_token_of_the_submitters_choosing_is_refused(system: Sys) -> None:
    """A known token would open the notebook to whoever chose it: gpufleet makes it."""
    spec = notebook_spec(env={NOTEBOOK_TOKEN_ENV: "guessable"})
    refused = await system.call(SubmitJob.SUBJECT, SubmitJob(spec=spec).to_bytes(), ATTACKER)
    assert refused["error"]["code"] == "invalid"
    assert [f["field"] for f in refused["error"]["fields"]] == ["spec.env"]
