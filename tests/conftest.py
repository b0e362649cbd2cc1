"""Shared fixtures: real servers (nats-server with JetStream, nx-27017 as MongoDB).

Session-scoped servers are shared by all tests; each test isolates itself with its own
database names (`db_prefix`) and its own stream/subject names. Tests that kill or restart
a server take `fresh_nats` / `fresh_mongo`, which belong to that test alone.

Only gpufleet_devstack is imported here: the service packages import their own fixtures.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpufleet_devstack import EmbeddedMongo, NatsServer

TESTS_DIR = Path(__file__).parent
# What the CLI reads of who it is and where (gpufleet_cli.settings), besides its config dir.
CLI_IDENTITY = ("GPUFLEET_CONTEXT", "GPUFLEET_NATS_CREDS", "GPUFLEET_NATS_URL", "GPUFLEET_ACCOUNT")
FOLDER_MARKERS = {
    "unit": "unit",
    "integration": "integration",
    "e2e": "e2e",
    "security": "security",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test after its folder: tests/unit -> unit, tests/integration -> ..."""
    for item in items:
        try:
            parts = Path(item.path).resolve().relative_to(TESTS_DIR.resolve()).parts
        except ValueError:
            continue
        marker = FOLDER_MARKERS.get(parts[0]) if parts else None
        if marker is not None and item.get_closest_marker(marker) is None:
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(autouse=True)
def _no_user_cli_context(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads or writes the developer's own CLI contexts (`just up` leaves one current
    in ~/.config/gpufleet: a test would then act as its account): each test starts with an
    empty config directory and none of the CLI's identity variables; a test sets its own."""
    monkeypatch.setenv("GPUFLEET_CONFIG_DIR", str(tmp_path_factory.mktemp("cli-config")))
    for name in CLI_IDENTITY:
        monkeypatch.delenv(name, raising=False)


def _serving(server: NatsServer | EmbeddedMongo) -> Iterator[Any]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server (JetStream on) for the whole session, on a free port."""
    yield from _serving(NatsServer(tmp_path_factory.mktemp("nats") / "store"))


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedMongo]:
    """One embedded MongoDB for the whole session; use `db_prefix` for database names."""
    yield from _serving(EmbeddedMongo(tmp_path_factory.mktemp("mongo") / "data"))


@pytest.fixture
def fresh_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A nats-server of this test's own, free to kill() and restart()."""
    yield from _serving(NatsServer(tmp_path_factory.mktemp("fresh-nats") / "store"))


@pytest.fixture
def fresh_mongo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedMongo]:
    """An embedded MongoDB of this test's own, free to kill() and restart()."""
    yield from _serving(EmbeddedMongo(tmp_path_factory.mktemp("fresh-mongo") / "data"))


@pytest.fixture
def db_prefix() -> str:
    """A unique prefix (`t` + 8 hex digits) for this test's database names."""
    return f"t{uuid.uuid4().hex[:8]}"
