"""What `just up` leaves for a new user (the CLI's context `local`) and `just clean`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gpufleet_cli import settings as cli_settings
from gpufleet_devstack import NatsServer, identities, wait_for
from gpufleet_devstack.clean import clean, users_of
from gpufleet_devstack.cli_context import save_local_context


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUFLEET_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("GPUFLEET_CONTEXT", raising=False)
    return tmp_path / "config"


def test_up_leaves_a_current_context_for_its_user(nats_server: NatsServer, config: Path) -> None:
    saved = save_local_context(nats_server.url, identities.user_creds(nats_server))
    assert saved.current and saved.other is None
    cfg = cli_settings.load()
    assert cli_settings.current_name(cfg) == "local"
    assert cfg.url == nats_server.url
    assert cfg.acting_account() == "local"
    again = save_local_context("nats://127.0.0.1:4999", identities.user_creds(nats_server))
    assert again.current and cli_settings.load().url == "nats://127.0.0.1:4999"  # refreshed


def test_up_keeps_the_context_the_user_chose(nats_server: NatsServer, config: Path) -> None:
    creds = identities.user_creds(nats_server)
    cfg = cli_settings.load()
    cli_settings.save_context(cfg, "prod", "nats://prod:4222", cli_settings.Creds.read(creds))
    saved = save_local_context(nats_server.url, creds)
    assert (saved.current, saved.other) == (False, "prod")
    assert cli_settings.current_name(cli_settings.load()) == "prod"
    assert cli_settings.read_context(cli_settings.load(), "local") is not None


def test_clean_refuses_while_something_runs_on_the_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    # one process (a shell would fork its sleep: a child naming the directory until it execs)
    holder = [sys.executable, "-c", "import time; time.sleep(60)", str(run_dir / "logs")]
    user = subprocess.Popen(holder, start_new_session=True)
    try:
        # its command line is the new one a moment after Popen returns
        wait_for(lambda: users_of(run_dir) == [user.pid], timeout=10)
        assert clean(run_dir) == 1
        assert run_dir.exists()
    finally:
        os.killpg(user.pid, signal.SIGKILL)
        user.wait()
    assert clean(run_dir) == 0
    assert not run_dir.exists()
    assert clean(run_dir) == 0  # nothing to remove
