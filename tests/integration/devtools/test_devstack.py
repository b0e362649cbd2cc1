"""The dev stack itself: real nats-server, real nx-27017, real child processes."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from pathlib import Path

import nats
import pytest
from gpufleet_devstack import (
    EmbeddedMongo,
    NatsServer,
    PortInUseError,
    ServiceProcess,
    wait_for,
    wait_for_async,
)
from gpufleet_devstack import up as devstack_up


def _stream_name() -> str:
    return f"T{uuid.uuid4().hex[:8].upper()}"


# -- nats-server ------------------------------------------------------------------------


async def test_nats_jetstream_publish_and_read_back(nats_server: NatsServer) -> None:
    assert nats_server.running
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    stream = _stream_name()
    nc = await nats.connect(nats_server.url, **nats_server.admin())
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        for i in range(3):
            ack = await js.publish(f"{stream.lower()}.x", f"m{i}".encode())
            assert ack.stream == stream
            assert ack.seq == i + 1
        info = await js.stream_info(stream)
        assert info.state.messages == 3
        msg = await js.get_msg(stream, 2)
        assert msg.data == b"m1"
        await js.delete_stream(stream)
    finally:
        await nc.close()


async def test_nats_kill_and_restart_keeps_jetstream_data(fresh_nats: NatsServer) -> None:
    stream = _stream_name()
    port, store_dir = fresh_nats.port, fresh_nats.store_dir
    nc = await nats.connect(fresh_nats.url, **fresh_nats.admin())
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    for i in range(5):
        await js.publish(f"{stream.lower()}.x", f"m{i}".encode())
    await nc.close()

    first_pid = fresh_nats.pid
    fresh_nats.kill()
    assert not fresh_nats.running
    fresh_nats.restart()
    assert fresh_nats.running
    assert fresh_nats.pid != first_pid
    assert (fresh_nats.port, fresh_nats.store_dir) == (port, store_dir)

    nc = await nats.connect(fresh_nats.url, **fresh_nats.admin())
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        assert info.state.messages == 5
        assert (await js.get_msg(stream, 5)).data == b"m4"
    finally:
        await nc.close()


async def test_nats_client_reconnects_after_restart(fresh_nats: NatsServer) -> None:
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    nc = await nats.connect(
        fresh_nats.url,
        **fresh_nats.admin(),
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        reconnected_cb=on_reconnect,
    )
    try:
        sub = await nc.subscribe("ping")
        fresh_nats.kill()
        fresh_nats.restart()
        await asyncio.wait_for(reconnected.wait(), timeout=10)
        await nc.publish("ping", b"pong")
        assert (await sub.next_msg(timeout=2)).data == b"pong"
    finally:
        await nc.close()


async def test_nats_refuses_an_anonymous_connection(nats_server: NatsServer) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            nats_server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2
        )


def test_nats_refuses_a_busy_port(nats_server: NatsServer, tmp_path: Path) -> None:
    second = NatsServer(tmp_path / "store", port=nats_server.port)
    with pytest.raises(PortInUseError, match=str(nats_server.port)):
        second.start()
    assert not second.running


def test_a_chosen_port_taken_before_the_first_start_is_chosen_again(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A port chosen ahead can be taken before the server starts (an outgoing connection's
    ephemeral port can be any free one: a cluster member's start once failed so in CI).
    One chosen here is chosen again at the first start; a given one, or the port of a
    server that ran before (its clients know it), is refused."""
    second = NatsServer(tmp_path / "store")
    second.port = nats_server.port  # as if taken since it was chosen
    second.start()
    try:
        assert second.running and second.port != nats_server.port
    finally:
        second.stop()
    squatter = NatsServer(tmp_path / "squatter", port=second.port)  # its port, taken now
    squatter.start()
    try:
        with pytest.raises(PortInUseError, match=str(second.port)):
            second.start()  # a restart keeps its port
        assert not second.running
    finally:
        squatter.stop()


# -- embedded MongoDB -------------------------------------------------------------------


def test_mongo_document_survives_kill_and_restart(
    fresh_mongo: EmbeddedMongo, db_prefix: str
) -> None:
    port = fresh_mongo.port
    assert fresh_mongo.url == f"mongodb://127.0.0.1:{port}/?directConnection=true"
    client = fresh_mongo.client()
    try:
        client[f"{db_prefix}_jobs"].jobs.insert_one({"_id": "job-1", "state": "queued"})
    finally:
        client.close()

    fresh_mongo.kill()
    assert not fresh_mongo.running
    fresh_mongo.restart()
    assert fresh_mongo.port == port

    client = fresh_mongo.client()
    try:
        doc = client[f"{db_prefix}_jobs"].jobs.find_one({"_id": "job-1"})
        assert doc == {"_id": "job-1", "state": "queued"}
    finally:
        client.close()


def test_two_mongo_instances_at_once(
    mongo_server: EmbeddedMongo, fresh_mongo: EmbeddedMongo, db_prefix: str
) -> None:
    assert mongo_server.running and fresh_mongo.running
    assert mongo_server.port != fresh_mongo.port
    assert mongo_server.pid_file != fresh_mongo.pid_file
    assert mongo_server.log_file != fresh_mongo.log_file
    a, b = mongo_server.client(), fresh_mongo.client()
    try:
        a[db_prefix].things.insert_one({"_id": 1, "on": "a"})
        b[db_prefix].things.insert_one({"_id": 1, "on": "b"})
        assert a[db_prefix].things.find_one({"_id": 1}) == {"_id": 1, "on": "a"}
        assert b[db_prefix].things.find_one({"_id": 1}) == {"_id": 1, "on": "b"}
    finally:
        a.close()
        b.close()
    # --data-dir: one SQLite file per logical database
    assert (mongo_server.data_dir / f"{db_prefix}.db").exists()


def test_db_prefix_is_unique(db_prefix: str) -> None:
    assert len(db_prefix) == 9 and db_prefix.startswith("t")
    int(db_prefix[1:], 16)


# -- ServiceProcess ---------------------------------------------------------------------

CHILD = "import os, time; print('started', os.getpid(), flush=True); time.sleep(600)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)


def test_service_process_start_kill_restart_stop(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"
    proc = ServiceProcess("child", [sys.executable, "-c", CHILD], None, log)
    assert proc.pid is None and not proc.alive
    proc.start()
    try:
        first = proc.pid
        assert proc.alive
        wait_for(lambda: "started" in log.read_text(), timeout=10)

        proc.kill()
        assert not proc.alive
        assert proc.returncode == -signal.SIGKILL

        proc.restart()
        assert proc.alive and proc.pid != first
        wait_for(lambda: log.read_text().count("started") == 2, timeout=10)
    finally:
        code = proc.stop()
    assert code == -signal.SIGTERM
    assert not proc.alive
    assert proc.starts == 2


def test_service_process_env_and_sigkill_escalation(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    env = {"GPUFLEET_TEST_VALUE": "42"}
    code = f"import os; print('value', os.environ['GPUFLEET_TEST_VALUE'], flush=True); {STUBBORN}"
    proc = ServiceProcess("stubborn", [sys.executable, "-c", code], env, log, stop_timeout=0.5)
    proc.start()
    wait_for(lambda: "ready" in log.read_text(), timeout=10)
    assert "value 42" in log.read_text()
    assert proc.stop() == -signal.SIGKILL


async def test_wait_for_helpers_time_out() -> None:
    with pytest.raises(TimeoutError, match="never"):
        wait_for(lambda: False, timeout=0.2, message="never")

    async def not_yet() -> bool:
        return False

    with pytest.raises(TimeoutError):
        await wait_for_async(not_yet, timeout=0.2)
    await wait_for_async(lambda: True, timeout=0.2)


# -- up.py ------------------------------------------------------------------------------


def test_up_exits_1_when_the_nats_port_is_busy(
    nats_server: NatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GPUFLEET_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("GPUFLEET_NATS_PORT", str(nats_server.port))
    assert devstack_up.run(["--no-block"]) == 1
    assert f"port {nats_server.port}" in capsys.readouterr().out


def test_up_finds_the_repo_root(tmp_path: Path) -> None:
    (tmp_path / "justfile").write_text("up:\n")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert devstack_up.find_repo_root(nested) == tmp_path
    assert devstack_up.SERVICES[-1].module == "gpufleet_node_agent"
