"""Each node's log stream (gpufleet_bus.streams.node_logs_config): the provisioner makes it
when the node enrols, with its limits, before the node gets a credential; refuses the node
when the JetStream store cannot reserve it; deletes it with the node; and, at start, gives
every node enrolled before this release its own, once the shared log stream is retired."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from gpufleet_bus.streams import ensure_streams
from gpufleet_contracts import subjects
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_node_agent.enrol import EnrolmentError, enrol
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import NotFoundError

from ..conftest import admin_connect
from .test_nodes import TEST_NODE_LOG_BYTES, Bus, provisioner

MIB = 1024 * 1024


async def added(bus: Bus, minion: str) -> None:
    """A node of the account's region `lab`, added (to be removed later) and enrolled."""
    await bus.ask("enable_provider", {"provider": "physical"})  # again: a conflict, fine
    await bus.ask("create_region", {"name": "lab"})
    await bus.ask("add_node", {"region": "lab", "name": minion, "minion_id": minion})
    await bus.node(minion, "lab")


@pytest.fixture
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A server whose JetStream store holds REPORTS (512 MiB reserved) and one node's logs of
    64 MiB, not two."""
    server = NatsServer(
        tmp_path_factory.mktemp("small") / "store",
        config="max_control_line: 32768\n",
        max_file_store=f"{512 + 64 + 32}MB",
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_an_enrolled_node_has_a_log_stream_of_its_own_until_it_is_removed(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        m = f"logs-{uuid.uuid4().hex[:6]}"
        await added(bus, m)
        js = bus.nc.jetstream()
        config = (await js.stream_info(subjects.node_logs_stream(m))).config
        assert config.subjects == [f"{subjects.LOGS}.{m}.>"]
        assert (config.max_bytes, config.discard) == (TEST_NODE_LOG_BYTES, DiscardPolicy.OLD)
        assert config.max_msgs > 0 and config.deny_delete and config.deny_purge
        assert (await bus.ask("remove_node", {"node": m}))["state"] == "removed"
        with pytest.raises(NotFoundError):
            await js.stream_info(subjects.node_logs_stream(m))


async def test_a_node_whose_log_stream_has_no_room_is_not_enrolled(
    small_store: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """The store has room for one node's logs: a second node is refused with the reason
    (the operator's two ways out), gets no credential, and its token stays good; once the
    first is removed, it enrols with it."""
    async with provisioner(
        small_store, mongo_server, db_prefix, node_log_max_bytes=64 * MIB
    ) as bus:
        await added(bus, "first")
        path = small_store.authority.directory / "test-nodes" / "second.creds"
        token = (await bus.token("second"))["token"]
        with pytest.raises(EnrolmentError, match="max_file_store"):
            await enrol([small_store.url], token, "second", path, attempts=1)
        assert not path.exists()
        js = bus.nc.jetstream()
        with pytest.raises(NotFoundError):
            await js.stream_info(subjects.node_logs_stream("second"))

        assert (await bus.ask("remove_node", {"node": "first"}))["state"] == "removed"
        await enrol([small_store.url], token, "second", path, attempts=1)  # the same token
        await js.stream_info(subjects.node_logs_stream("second"))


async def test_at_start_the_shared_log_stream_is_retired_and_enrolled_nodes_get_their_own(
    fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """A store of an earlier release: one GPUFLEET_LOGS for every node, nodes enrolled
    without a stream of their own. The provisioner's start deletes the shared one and makes
    each enrolled node's."""
    async with provisioner(fresh_nats, mongo_server, db_prefix) as bus:
        m = f"old-{uuid.uuid4().hex[:6]}"
        await bus.node(m, "lab")
    admin = await admin_connect(fresh_nats)
    js = admin.jetstream()
    try:
        await js.delete_stream(subjects.node_logs_stream(m))  # as an earlier release had it
        shared = StreamConfig(
            name=subjects.STREAM_LOGS, subjects=[f"{subjects.LOGS}.>"], max_bytes=2 * 1024 * MIB
        )
        await js.add_stream(shared)
        await ensure_streams(js)
        async with provisioner(fresh_nats, mongo_server, db_prefix):
            await js.stream_info(subjects.node_logs_stream(m))
            with pytest.raises(NotFoundError):
                await js.stream_info(subjects.STREAM_LOGS)
    finally:
        await admin.close()
