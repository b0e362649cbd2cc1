"""Secrets (R-JOB-7 env values, R-PROV-2): never in events, replies, dead letters or files
other than the worker's own 0600 env file; sealed in the scheduler's job documents."""

from __future__ import annotations

import asyncio
import hashlib
import json
import stat
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
import pytest
from cryptography.fernet import Fernet
from gpufleet_bus.deadletter import dead_letter_bytes
from gpufleet_contracts import limits
from gpufleet_contracts.jobs import JobQueued, JobSpec, StartWorker, SubmitJob
from gpufleet_contracts.secrets import REDACTED
from gpufleet_node_agent.runtimes.process import ProcessRuntime
from gpufleet_node_agent.worker.manager import ENV_FILE, WorkerManager
from gpufleet_node_agent.worker.workdir import Worker
from gpufleet_scheduler import jobdoc, jobrequest
from gpufleet_store import SecretBox, SecretError

pytestmark = pytest.mark.unit
VALUE = "s3cr3t-value"
BASE: dict[str, Any] = {"name": "hello", "gpu_types": ["RTX 3090"], "command": ["true"]}


def spec(**kw: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, "env": {"TOKEN": VALUE, "MODE": "fast"}, **kw})


def box() -> SecretBox:
    return SecretBox(Fernet.generate_key().decode())


# --- contracts ----------------------------------------------------------------------------


def test_a_redacted_spec_keeps_the_names_and_hides_every_value() -> None:
    s = spec()
    red = s.redacted()
    assert red.env == {"TOKEN": REDACTED, "MODE": REDACTED}
    assert red.model_copy(update={"env": s.env}) == s  # nothing else changed
    assert JobSpec.model_validate(red.model_dump(mode="json")) == red  # still a valid spec
    no_env = JobSpec.model_validate(BASE)
    assert no_env.redacted() is no_env


def test_job_queued_made_from_a_redacted_spec_holds_no_value() -> None:
    evt = JobQueued(
        job_id="j1", owner="a", creator="a", spec=spec().redacted(), queued_at=datetime.now(UTC)
    )
    data = evt.to_bytes()
    assert VALUE.encode() not in data and b"TOKEN" in data
    assert JobQueued.from_bytes(data).spec.env["TOKEN"] == REDACTED


def test_reprs_never_show_env_values() -> None:
    start = StartWorker(
        minion_id="m1",
        job_id="j1",
        job_name="n",
        worker=0,
        command=["true"],
        env={"TOKEN": VALUE},
        gpu_indices=[0],
        placement_id="p1",
    )
    for obj in (spec(), start, SubmitJob(spec=spec())):
        assert VALUE not in repr(obj) and VALUE not in str(obj)


def json_size(data: dict[str, Any]) -> int:
    return len(JobSpec.model_construct(**data).model_dump_json(by_alias=True))


def with_size(data: dict[str, Any], size: int) -> dict[str, Any]:
    """`data` with its command padded so that its JSON is `size` bytes."""
    command: list[str] = []
    out = {**data, "command": command}
    while json_size(out) + 4100 < size:
        command.append("x" * 4000)
    command.append("")
    command[-1] = "x" * (size - json_size(out))
    assert json_size(out) == size
    return out


def test_short_env_values_count_as_the_marker_so_a_redacted_spec_still_fits() -> None:
    """The cap counts an env value as at least REDACTED's length: a spec at the cap stays
    valid once its values are replaced (JobQueued is validated by its readers)."""
    data = {**BASE, "env": {f"V{i}": "" for i in range(limits.ENV_VARS)}}
    room = limits.SPEC_BYTES - limits.ENV_VARS * len(REDACTED)
    at_cap = JobSpec.model_validate(with_size(data, room))
    JobSpec.model_validate(at_cap.redacted().model_dump(mode="json"))  # fits too
    with pytest.raises(ValueError, match="more than the cap"):
        JobSpec.model_validate(with_size(data, room + 1))


# --- dead letters -------------------------------------------------------------------------


def test_a_dead_letter_record_leaves_secrets_out() -> None:
    body = json.dumps(
        {"spec": {**BASE, "env": {"TOKEN": VALUE}, "gpu_count": "x"}, "key_json": VALUE}
    ).encode()
    record = json.loads(dead_letter_bytes("scheduler", "s", body, {}, "invalid", []))
    payload = record["payload"]
    assert payload["spec"]["env"] == {"TOKEN": REDACTED}
    assert payload["key_json"] == REDACTED and payload["spec"]["gpu_count"] == "x"
    assert VALUE not in json.dumps(record)


# --- the scheduler's job documents --------------------------------------------------------


def test_a_job_document_holds_the_names_and_the_values_only_sealed() -> None:
    b = box()
    doc = jobdoc.new_job("j1", spec(), "acme", datetime.now(UTC), None, box=b)
    assert VALUE.encode() not in bson.encode(doc)
    assert doc["spec"]["env"] == {"TOKEN": REDACTED, "MODE": REDACTED}
    assert jobrequest.spec_of(doc, b) == spec()
    with pytest.raises(SecretError):
        jobrequest.spec_of(doc, box())


def test_a_job_without_env_has_nothing_sealed_and_needs_no_key() -> None:
    plain = JobSpec.model_validate(BASE)
    doc = jobdoc.new_job("j1", plain, "acme", datetime.now(UTC), None)
    assert "env_sealed" not in doc and jobrequest.spec_of(doc, box()) == plain
    with pytest.raises(ValueError, match="key"):
        jobdoc.new_job("j1", spec(), "acme", datetime.now(UTC), None)


def test_a_job_as_replies_show_it_has_no_value_not_even_one_stored_before() -> None:
    doc = jobdoc.new_job("j1", spec(), "acme", datetime.now(UTC), None, box=box())
    assert VALUE not in json.dumps(jobdoc.view(doc))
    assert jobdoc.view(doc)["spec"]["env"] == {"TOKEN": REDACTED, "MODE": REDACTED}
    older = {**doc, "spec": spec().model_dump(mode="json", exclude_defaults=True)}
    del older["env_sealed"]
    assert jobdoc.view(older)["spec"]["env"] == {"TOKEN": REDACTED, "MODE": REDACTED}
    assert jobrequest.spec_of(older, box()).env["TOKEN"] == VALUE  # still runs as it was sent


# --- the node agent -----------------------------------------------------------------------


def token_check() -> str:
    """A worker command that exits 0 when TOKEN is VALUE, without VALUE in its text."""
    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    return (
        "import hashlib, os, sys; t = os.environ.get('TOKEN', '').encode();"
        f"ok = hashlib.sha256(t).hexdigest() == {digest!r};"
        "print('token ok' if ok else 'token missing'); sys.exit(0 if ok else 3)"
    )


class Idle(ProcessRuntime):
    """Launches nothing: the worker's directory stays as `start` wrote it."""

    async def launch(self, w: Worker) -> None:
        return None


class Broker:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def publish(self, message: bytes, subject: str, **kw: Any) -> None:
        self.sent.append(message)


async def test_the_worker_gets_its_env_and_only_a_0600_file_held_it(tmp_path: Path) -> None:
    code = token_check()
    broker = Broker()
    m = WorkerManager(tmp_path, "m1", broker, gpu_indices=[0])
    cmd = StartWorker(
        minion_id="m1",
        job_id="j1",
        job_name="n",
        worker=0,
        command=[sys.executable, "-c", code],
        env={"TOKEN": VALUE},
        gpu_indices=[0],
        placement_id="p1",
    )
    # As the directory appears: spec.json without the value, env.json 0600 (a runtime that
    # launches nothing leaves them as they are).
    idle = WorkerManager(tmp_path / "idle", "m1", broker, gpu_indices=[0], runtime=Idle())
    assert idle.start(cmd) is True
    written = idle.worker_dir("p1")
    assert stat.S_IMODE((written / ENV_FILE).stat().st_mode) == 0o600
    assert json.loads((written / ENV_FILE).read_text()) == {"TOKEN": VALUE}
    assert VALUE.encode() not in (written / "spec.json").read_bytes()

    d = m.worker_dir("p1")
    assert m.start(cmd) is True
    spec_json = json.loads((d / "spec.json").read_text())
    assert "env" not in spec_json and spec_json["env_names"] == ["TOKEN"]
    deadline = time.monotonic() + 20
    while not (d / "exit.json").exists():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert json.loads((d / "exit.json").read_text())["exit_code"] == 0
    assert (d / "log").read_text() == "token ok\n"
    assert not (d / ENV_FILE).exists()  # read by the supervisor, then deleted
    for f in d.rglob("*"):
        if f.is_file():
            assert VALUE.encode() not in f.read_bytes(), f
    while m.active:
        await m.poll_once()
        assert time.monotonic() < deadline
    assert all(VALUE.encode() not in msg for msg in broker.sent)
