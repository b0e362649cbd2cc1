"""nats-server with an encrypted JetStream file store (as everywhere here) keeps its streams
through kill -9 and clean restarts, in any order: nats-server 2.11.11 lost them all after a
kill -9 then a clean restart (docs/reliability.md, "Versions")."""

from __future__ import annotations

import nats
import pytest
from gpufleet_bus.streams import ensure_streams
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import WorkerPlaced
from gpufleet_devstack import NatsServer

pytestmark = pytest.mark.integration


async def _publish(server: NatsServer, n: int) -> int:
    nc = await nats.connect(server.url, **server.admin())
    try:
        js = nc.jetstream()
        for i in range(n):
            await js.publish(WorkerPlaced.SUBJECT, f'{{"n": {i}}}'.encode(), timeout=5)
        return n
    finally:
        await nc.close()


async def _stored(server: NatsServer) -> int:
    nc = await nats.connect(server.url, **server.admin())
    try:
        info = await nc.jetstream().stream_info(subjects.STREAM_EVENTS)
        return int(info.state.messages)
    finally:
        await nc.close()


async def test_encrypted_streams_survive_kill_9_then_clean_restarts(fresh_nats: NatsServer) -> None:
    assert fresh_nats.encrypt
    nc = await nats.connect(fresh_nats.url, **fresh_nats.admin())
    await ensure_streams(nc.jetstream())
    await nc.close()
    acked = 0
    for _ in range(2):
        acked += await _publish(fresh_nats, 50)
        fresh_nats.kill()  # no index.db written
        fresh_nats.restart()
        acked += await _publish(fresh_nats, 50)
        fresh_nats.stop()  # a clean stop writes the streams' state (and, on 2.11.11, new keys)
        fresh_nats.start()
        assert await _stored(fresh_nats) == acked
    assert "Error decrypting" not in fresh_nats.log_file.read_text()
