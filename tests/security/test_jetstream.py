"""Attack class 6: the JetStream API (streams, messages, consumers).

Users have no JetStream API at all; a node agent may only read and ack the one command
consumer the provisioner made for it. Purging, deleting, creating consumers and reading
another node's commands are refused by the server.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from gpufleet_bus.streams import node_consumer
from gpufleet_contracts import Envelope, subjects
from gpufleet_contracts.nodes import NodeHeartbeat

from .attack import Client
from .conftest import (
    EVIL_NODE,
    VICTIM_NODE,
    System,
    Victim,
    admin_js,
    attacker_subject,
    consumer_names,
    stream_state,
)

VICTIM_LOGS = subjects.node_logs_stream(VICTIM_NODE)  # the victim node's log stream
STREAMS = (subjects.STREAM_EVENTS, VICTIM_LOGS, subjects.STREAM_COMMANDS)
ALL_STREAMS = (*STREAMS, subjects.STREAM_DLQ)
# What nodes report, until the scheduler reads it (a work queue: its counts go down by
# themselves, so only the refusals are checked there)
REPORTS = subjects.STREAM_REPORTS
ATTEMPTED = (*ALL_STREAMS, REPORTS)


@pytest.fixture(params=["user", "node"])
def intruder(request: pytest.FixtureRequest, eve: Path, evil_node: Path) -> Path:
    """A user of another account, or the node agent of another minion."""
    return eve if request.param == "user" else evil_node


async def states(system: System) -> dict[str, Any]:
    """Each stream's first sequence and message count, and its consumers."""
    return {
        s: {**(await stream_state(system, s)), "consumers": await consumer_names(system, s)}
        for s in ALL_STREAMS
    }


def untouched(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Nothing purged or deleted (same first sequence, never fewer messages), no new
    consumer (ephemeral ones of earlier reads may have gone away meanwhile)."""
    for stream, was in before.items():
        now = after[stream]
        # (an empty stream's first sequence moves when its first message arrives)
        assert now["first_seq"] == was["first_seq"] or was["messages"] == 0, stream
        assert now["messages"] >= was["messages"], stream
        assert set(now["consumers"]) <= set(was["consumers"]), stream


async def attempt_each(system: System, who: Path, requests: list[tuple[str, Any]]) -> None:
    async with Client(system.nats.url, who) as attacker:
        for subject, body in requests:
            await attacker.request_refused(subject, body)


async def test_purging_a_stream_is_refused(system: System, victim: Victim, intruder: Path) -> None:
    """`$JS.API.STREAM.PURGE.<stream>` on every gpufleet stream: refused, nothing lost."""
    before = await states(system)
    await attempt_each(system, intruder, [(f"$JS.API.STREAM.PURGE.{s}", {}) for s in ATTEMPTED])
    untouched(before, await states(system))
    await victim.assert_untouched()


async def test_deleting_a_stream_is_refused(system: System, victim: Victim, intruder: Path) -> None:
    """`$JS.API.STREAM.DELETE.<stream>`: refused."""
    before = await states(system)
    await attempt_each(system, intruder, [(f"$JS.API.STREAM.DELETE.{s}", {}) for s in ATTEMPTED])
    untouched(before, await states(system))
    await victim.assert_untouched()


async def test_deleting_a_message_is_refused(
    system: System, victim: Victim, intruder: Path
) -> None:
    """`$JS.API.STREAM.MSG.DELETE.<stream>` of each stream's first message: refused."""
    before = await states(system)
    await attempt_each(
        system,
        intruder,
        [
            (f"$JS.API.STREAM.MSG.DELETE.{s}", {"seq": before[s]["first_seq"], "no_erase": True})
            for s in ALL_STREAMS
        ],
    )
    untouched(before, await states(system))
    await victim.assert_untouched()


async def test_creating_a_consumer_is_refused(
    system: System, victim: Victim, intruder: Path
) -> None:
    """An ephemeral and a durable consumer on EVENTS, the victim node's LOGS, COMMANDS and
    REPORTS (to read every event, the victim's output, every node's commands, or to take
    the nodes' reports before the scheduler): refused, none exists."""
    before = await states(system)

    def config(stream: str, durable: str | None = None) -> dict[str, Any]:
        cfg: dict[str, Any] = {"deliver_policy": "all", "ack_policy": "none"}
        if durable:
            cfg["durable_name"] = durable
        return {"stream_name": stream, "config": cfg}

    await attempt_each(
        system,
        intruder,
        [(f"$JS.API.CONSUMER.CREATE.{s}", config(s)) for s in (*STREAMS, REPORTS)]
        + [
            (f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.attacker", config(s, "attacker"))
            for s in (*STREAMS, REPORTS)
        ]
        + [
            (f"$JS.API.CONSUMER.CREATE.{s}.attacker.{subjects.ROOT}.>", config(s, "attacker"))
            for s in (*STREAMS, REPORTS)
        ],
    )
    untouched(before, await states(system))
    await victim.assert_untouched()


async def test_reading_stream_messages_directly_is_refused(
    system: System, victim: Victim, intruder: Path
) -> None:
    """`$JS.API.STREAM.MSG.GET` and `$JS.API.DIRECT.GET` of stored messages (the victim's
    job output, its events): refused."""
    await attempt_each(
        system,
        intruder,
        [(f"$JS.API.STREAM.MSG.GET.{s}", {"seq": 1}) for s in ATTEMPTED]
        + [
            (f"$JS.API.DIRECT.GET.{s}.{subjects.LOGS}.{VICTIM_NODE}.{victim.job_id}.0", {})
            for s in (VICTIM_LOGS,)
        ],
    )
    await victim.assert_untouched()


async def test_reading_another_nodes_command_consumer_is_refused(
    system: System, victim: Victim, intruder: Path
) -> None:
    """The victim node's own command consumer, `node-local-node-1`: its info, its next
    message (that would steal the victim's StartWorker), its deletion: refused, and the
    consumer has delivered nothing more."""
    consumer = node_consumer(VICTIM_NODE)

    async def delivered(js: Any) -> int:
        info = await js.consumer_info(subjects.STREAM_COMMANDS, consumer)
        return int(info.delivered.stream_seq)

    before = await admin_js(system, delivered)
    await attempt_each(
        system,
        intruder,
        [
            (f"$JS.API.CONSUMER.INFO.{subjects.STREAM_COMMANDS}.{consumer}", {}),
            (f"$JS.API.CONSUMER.MSG.NEXT.{subjects.STREAM_COMMANDS}.{consumer}", {"batch": 1}),
            (f"$JS.API.CONSUMER.DELETE.{subjects.STREAM_COMMANDS}.{consumer}", {}),
        ],
    )
    assert await admin_js(system, delivered) == before
    assert consumer in await consumer_names(system, subjects.STREAM_COMMANDS)
    await victim.assert_untouched()


async def test_a_user_has_no_jetstream_api_at_all(
    system: System, victim: Victim, eve: Path
) -> None:
    """Account info, stream names and stream info: refused to a user."""
    await attempt_each(
        system,
        eve,
        [
            ("$JS.API.INFO", {}),
            ("$JS.API.STREAM.NAMES", {}),
            *[(f"$JS.API.STREAM.INFO.{s}", {}) for s in ALL_STREAMS],
            *[(f"$JS.API.CONSUMER.NAMES.{s}", {}) for s in ALL_STREAMS],
        ],
    )
    await victim.assert_untouched()


async def test_a_node_reads_only_its_own_commands(system: System, evil_node: Path) -> None:
    """The evil node may ask for its own consumer (there is none: it never enrolled), not
    for any other: the grant is bound to its minion id."""
    async with Client(system.nats.url, evil_node) as node:
        own = f"$JS.API.CONSUMER.INFO.{subjects.STREAM_COMMANDS}.{node_consumer(EVIL_NODE)}"
        reply = await node.request(own, {})
        assert reply.get("error", {}).get("code") == 404, reply  # allowed, and there is none
        await node.request_refused(
            f"$JS.API.CONSUMER.INFO.{subjects.STREAM_COMMANDS}.{node_consumer('other')}", {}
        )


# What a requester may aim a service at by choosing the reply subject of its request.
AIMED = [
    *(f"$JS.API.STREAM.PURGE.{s}" for s in ALL_STREAMS),
    *(f"$JS.API.STREAM.DELETE.{s}" for s in ALL_STREAMS),
    f"$JS.API.CONSUMER.DELETE.{subjects.STREAM_EVENTS}.billing-worker-events",
    f"$JS.API.CONSUMER.DELETE.{subjects.STREAM_COMMANDS}.{node_consumer(VICTIM_NODE)}",
]


async def test_a_reply_subject_cannot_aim_a_service_at_the_jetstream_api(
    system: System, victim: Victim, eve: Path, evil_node: Path
) -> None:
    """A request (and a heartbeat, which is no request) whose reply subject is a JetStream
    API call: the service must not answer there, or its credential would make the call for
    the attacker (purge or delete a stream, delete another's consumer). Nothing is lost."""
    before = await states(system)
    requests = [
        ("scheduler", "list_jobs"),
        ("scheduler", "submit_job"),
        ("billing", "balance"),
        ("provisioner", "list_nodes"),
    ]
    async with Client(system.nats.url, eve) as attacker:
        for reply in AIMED:
            for service, verb in requests:
                subject = attacker_subject(service, verb)
                headers = Envelope(type="gpufleet.attack.v1", source="x", subject=subject)
                await attacker.nc.publish(subject, b"{}", reply=reply, headers=headers.headers())
        await attacker.nc.flush()
    beat = NodeHeartbeat(minion_id=EVIL_NODE, at=datetime.now(UTC)).to_bytes()
    async with Client(system.nats.url, evil_node) as node:
        for reply in AIMED:
            await node.nc.publish(subjects.heartbeat(EVIL_NODE), beat, reply=reply)
        await node.nc.flush()
    await asyncio.sleep(2)  # any answer would have been made by now
    after = await states(system)
    untouched(before, after)
    assert "billing-worker-events" in after[subjects.STREAM_EVENTS]["consumers"]
    assert node_consumer(VICTIM_NODE) in after[subjects.STREAM_COMMANDS]["consumers"]
    await victim.assert_untouched()
