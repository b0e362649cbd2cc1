"""The ack policy and the dead-letter path, against a real nats-server."""

from __future__ import annotations

import asyncio
import json

import nats
from gpufleet_bus import Delivery, Events, Ports, ServiceRuntime, publish
from gpufleet_bus.streams import NODE_LOG_MAX_BYTES, ensure_node_logs, ensure_streams
from gpufleet_contracts import Envelope, Event, subjects
from gpufleet_contracts.health import HealthCheck
from gpufleet_contracts.jobs import SubmitJob
from gpufleet_devstack import NatsServer, wait_for_async
from nats.js.api import DeliverPolicy, DiscardPolicy

from ..conftest import admin_connect, as_user, broker_for, running


class Pinged(Event):
    TYPE = "gpufleet.test.pinged.v1"
    SUBJECT = subjects.event("test", "pinged")
    n: int


async def read_stream(server: NatsServer, subject: str) -> list[nats.aio.msg.Msg]:
    """Every message of `subject` so far, read as an operator (the test harness)."""
    nc = await admin_connect(server)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        out = []
        while True:
            try:
                out.append(await sub.next_msg(timeout=0.5))
            except TimeoutError:
                return out
    finally:
        await nc.close()


async def test_invalid_event_is_dead_lettered_and_the_next_one_still_handled(
    fresh_nats: NatsServer,
) -> None:
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    seen: list[int] = []

    async def on_pinged(body: Pinged) -> None:
        seen.append(body.n)

    rt.wire(events={"pinged": on_pinged})

    async with running(rt.app):
        nc = await admin_connect(fresh_nats)
        js = nc.jetstream()

        def envelope() -> dict[str, str]:  # a new ce-id (= Nats-Msg-Id) each time
            return Envelope(type=Pinged.TYPE, source="test", subject=Pinged.SUBJECT).headers()

        await js.publish(Pinged.SUBJECT, b'{"n": "not a number"}', headers=envelope())
        await js.publish(Pinged.SUBJECT, b"\xff\xfe not json", headers=envelope())
        await js.publish(Pinged.SUBJECT, Pinged(n=8).to_bytes())  # no CloudEvents headers
        await publish(broker, Pinged(n=7), source="test")
        await wait_for_async(lambda: seen == [7], timeout=10)
        info = await js.consumer_info(subjects.STREAM_EVENTS, "svc-pinged")
        await nc.close()
    assert info.num_ack_pending == 0 and info.num_pending == 0  # termed, not redelivered
    dead = await read_stream(fresh_nats, subjects.dead_letter("svc", "*"))
    records = [json.loads(m.data) for m in dead]
    assert [r["reason"] for r in records] == ["invalid", "invalid", "invalid"]
    assert records[0]["errors"][0]["field"] == "n"
    assert records[0]["payload"] == {"n": "not a number"}
    assert records[1]["payload_encoding"] == "opaque"  # not JSON: size and hash only
    assert records[2]["errors"][0]["field"].startswith("ce-")  # an event without its envelope


async def test_a_failing_handler_is_retried_until_it_succeeds(fresh_nats: NatsServer) -> None:
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    attempts: list[int] = []

    async def flaky(body: Pinged, delivery: Delivery) -> None:
        assert delivery.subject == Pinged.SUBJECT and delivery.received_at is not None
        attempts.append(body.n)
        if len(attempts) < 3:
            raise ConnectionError("database briefly away")

    rt.wire(events={"flaky": flaky})

    async with running(rt.app):
        await publish(broker, Pinged(n=1), source="test")
        await wait_for_async(lambda: len(attempts) >= 3, timeout=15)
        await asyncio.sleep(1.0)
    assert attempts == [1, 1, 1]  # redelivered after each failure, never lost, then done
    assert await read_stream(fresh_nats, subjects.dead_letter("svc", "*")) == []


async def test_duplicate_publish_is_dropped_by_message_id(fresh_nats: NatsServer) -> None:
    broker = broker_for("svc", fresh_nats)
    async with running(ServiceRuntime("svc", Ports(broker)).app):
        for _ in range(3):
            await publish(broker, Pinged(n=1), source="test", msg_id="same-event")
    msgs = await read_stream(fresh_nats, Pinged.SUBJECT)
    assert len(msgs) == 1
    assert msgs[0].headers is not None and msgs[0].headers["ce-id"] == "same-event"


async def test_invalid_request_gets_a_structured_error_and_is_kept(
    fresh_nats: NatsServer,
) -> None:
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))

    async def submit(body: SubmitJob, account: str) -> dict[str, str]:
        raise AssertionError("an invalid request must not reach the handler")

    rt.wire(requests={"submit": submit})

    async with running(rt.app):
        bad = {
            "spec": {"name": "x", "gpu_types": ["RTX 3090"], "command": ["true"], "disk_size_gb": 5}
        }
        async with as_user(fresh_nats, "acme") as user:
            reply = await user.request(subjects.rpc("svc", "submit"), json.dumps(bad).encode(), 5)
    body = json.loads(reply.data)
    assert body["ok"] is False and body["error"]["code"] == "invalid"
    assert body["error"]["fields"] == [
        {
            "field": "spec.disk_size_gb",
            "rule": "R-JOB-2",
            "message": "Input should be greater than or equal to 10",
            "valid": "10..1000 GB per worker",
        }
    ]
    dead = await read_stream(fresh_nats, subjects.dead_letter("svc", "*"))
    assert len(dead) == 1


async def test_a_request_acts_for_its_subject_s_account_never_a_header(
    fresh_nats: NatsServer,
) -> None:
    """R-TEN-2: the account is the subject's last token (which only
    that account's users may publish); a client-set header changes nothing; a subject whose
    account token is not an account is refused as invalid."""
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))

    async def whoami(body: HealthCheck, account: str) -> dict[str, str]:
        return {"account": account}

    rt.wire(requests={"whoami": whoami})

    async with running(rt.app):
        subject = subjects.rpc("svc", "whoami")
        async with as_user(fresh_nats, "acme") as user:
            reply = await user.nc.request(
                subjects.as_account(subject, "acme"),
                b"{}",
                timeout=5,
                headers={"gpufleet-account": "other"},
            )
        nc = await admin_connect(fresh_nats)
        refused = await nc.request(subjects.as_account(subject, "@nobody"), b"{}", timeout=5)
        await nc.close()
    assert json.loads(reply.data) == {"account": "acme"}
    error = json.loads(refused.data)["error"]
    assert error["code"] == "invalid" and error["fields"][0]["rule"] == "R-TEN-2"


class Ponged(Event):
    TYPE = "gpufleet.test.ponged.v1"
    SUBJECT = subjects.event("test", "ponged")
    n: int


async def test_one_consumer_dispatches_by_type_in_stream_order(fresh_nats: NatsServer) -> None:
    """Events(...) reads several types from one consumer: each handler sees its own type,
    all of them in the order the stream stored them; a type the table does not name is
    dead-lettered, not handed to the wrong handler."""
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    seen: list[tuple[str, int]] = []

    async def pinged(body: Pinged) -> None:
        seen.append(("ping", body.n))

    async def ponged(body: Ponged) -> None:
        await asyncio.sleep(0.01 * (body.n % 3))  # slow handlers must not reorder
        seen.append(("pong", body.n))

    rt.wire(
        events={"test": Events({Pinged: pinged, Ponged: ponged}, subject="gpufleet.v1.evt.test.>")}
    )
    async with running(rt.app):
        for n in range(10):
            await publish(broker, (Pinged if n % 2 else Ponged)(n=n), source="test")
        nc = await admin_connect(fresh_nats)
        other = Envelope(type="gpufleet.test.other.v1", source="t", subject=Pinged.SUBJECT)
        await nc.jetstream().publish(Pinged.SUBJECT, b'{"n": 99}', headers=other.headers())
        await nc.close()
        await wait_for_async(lambda: len(seen) == 10, timeout=10)
        await asyncio.sleep(0.5)
    assert seen == [("pong" if n % 2 == 0 else "ping", n) for n in range(10)]
    dead = await read_stream(fresh_nats, subjects.dead_letter("svc", "*"))
    assert [json.loads(m.data)["errors"][0]["field"] for m in dead] == ["ce-type"]


async def test_a_nodes_logs_are_bounded_in_bytes_and_the_event_history_is_not(
    fresh_nats: NatsServer,
) -> None:
    """Jobs print what they like: a node's logs (its own stream) may not take the file
    store the events need; the history goes by age alone (30 days), and what nodes report
    waits in REPORTS, a bounded work queue (test_bounds.py)."""
    nc = await admin_connect(fresh_nats)
    js = nc.jetstream()
    await ensure_streams(js)
    await ensure_node_logs(js, "m1")
    logs = (await js.stream_info(subjects.node_logs_stream("m1"))).config
    events = (await js.stream_info(subjects.STREAM_EVENTS)).config
    assert logs.max_bytes == NODE_LOG_MAX_BYTES and logs.discard == DiscardPolicy.OLD
    assert logs.subjects == [f"{subjects.LOGS}.m1.>"]
    assert events.max_bytes == -1
    await nc.close()
