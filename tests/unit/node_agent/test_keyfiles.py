"""A worker's attached keys as files (keyfiles.py), as an agent without root writes them
(root mounts a tmpfs first: tests/integration/node_agent/test_podman_keys.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from gpufleet_node_agent.runtimes.supervise import worker_env
from gpufleet_node_agent.steps import keys as keyfiles
from gpufleet_node_agent.worker.spec import WorkerSpec

VALUE = "hf-v4lue"


@pytest.fixture
def no_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 4242)


def keys_file(d: Path, keys: object) -> None:
    d.mkdir(exist_ok=True)
    (d / keyfiles.KEYS_FILE).write_text(json.dumps(keys))


def test_keys_become_read_only_files_and_keys_json_goes(tmp_path: Path, no_root: None) -> None:
    keys_file(tmp_path, {"huggingface": {"token": VALUE}, "aws": {"access_key_id": "a"}})
    assert keyfiles.materialize(tmp_path, os.getuid()) is None
    secrets = tmp_path / "secrets"
    assert (secrets / "huggingface" / "token").read_text() == VALUE
    assert stat.S_IMODE((secrets / "huggingface" / "token").stat().st_mode) == 0o400
    assert stat.S_IMODE((secrets / "huggingface").stat().st_mode) == 0o500
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o500
    assert not (tmp_path / keyfiles.KEYS_FILE).exists()
    # again (a restart after a crash midway): nothing to do, nothing lost
    assert keyfiles.materialize(tmp_path, os.getuid()) is None
    assert (secrets / "aws" / "access_key_id").read_text() == "a"
    keyfiles.remove(tmp_path)
    assert not secrets.exists()
    keyfiles.remove(tmp_path)  # idempotent


def test_names_that_are_paths_are_refused(tmp_path: Path, no_root: None) -> None:
    keys_file(tmp_path, {"../x": {"token": VALUE}})
    error = keyfiles.materialize(tmp_path, os.getuid())
    assert error is not None and VALUE not in error
    keys_file(tmp_path, {"git": {"../../etc/passwd": VALUE}})
    error = keyfiles.materialize(tmp_path, os.getuid())
    assert error is not None and "field" in error and VALUE not in error


def test_no_keys_no_directory(tmp_path: Path) -> None:
    assert keyfiles.materialize(tmp_path, 0) is None
    assert not (tmp_path / "secrets").exists()


def test_a_bare_process_is_told_where_its_keys_are(tmp_path: Path) -> None:
    base = WorkerSpec(placement_id="p", job_id="j", worker=0, command=("true",))
    assert "SECRETS_PATH" not in worker_env(base, tmp_path, {})
    env = worker_env(base.model_copy(update={"key_types": ("wandb",)}), tmp_path, {})
    assert env["SECRETS_PATH"] == str(tmp_path / "secrets")
