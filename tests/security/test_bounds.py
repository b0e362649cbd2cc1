"""Attack class 9: bounded by whom. A node may publish what it likes on its own subjects: its
logs under any job id it makes up, its reports of workers (true or not); an account may
enrol as many nodes as it has join tokens for. What they can store is bounded per node, by
JetStream itself, and nothing they send pushes another account's logs out or fills the
event history: a node's logs go to a stream of its own (made by the provisioner when it
enrols), its reports wait in a work queue where each node may hold so many, and what the
scheduler does not take of them is never kept, and noticed once, not per message.

Before (found by an attacker): one 2 GiB log stream for every node, the oldest first, and
every report stored in the 30-day history: 2,000 chunks of 8 KiB from one node were all
kept, ~262,000 would have pushed every account's logs out, and a node's forged reports
went into the history, ignored by the services with no dead letter and no log line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from gpufleet_auth import Creds
from gpufleet_contracts import envelope_for, subjects
from gpufleet_contracts.jobs import WorkerFinished, WorkerState
from gpufleet_devstack import wait_for_async
from gpufleet_node_agent.enrol import enrol
from nats.js.api import DeliverPolicy

from .attack import Client
from .conftest import (
    ATTACKER_ACCOUNT,
    NODE_LOG_MAX_BYTES,
    NODE_LOG_MAX_MSGS,
    VICTIM_NODE,
    System,
    Victim,
    admin_js,
    attacker_subject,
    last_seq,
    stream_state,
)

KIB = 1024
# Literal names, not this release's constants: the attack reads the same on any release.
REPORTS = "GPUFLEET_REPORTS"
REPORTS_PER_SUBJECT = 1000


def node_logs(minion: str) -> str:
    return f"GPUFLEET_LOGS_{minion}"


async def enrolled_node(system: System, eve: Path, minion: str, path: Path) -> Creds:
    """A node of the attacker's account, enrolled with a join token its user asked for
    (`gpufleet node token`), as any account may."""
    body = {"minion_id": minion, "region": "local", "ttl_s": 3600}
    async with Client(system.nats.url, eve) as attacker:
        token = await attacker.request(attacker_subject("provisioner", "issue_join_token"), body)
    await enrol([system.nats.url], str(token["token"]), minion, path, attempts=1)
    return Creds.read(path)


async def flood(client: Client, messages: list[tuple[str, bytes]]) -> tuple[int, list[str]]:
    """JetStream publishes, 256 at a time: (acknowledged, the refusals' reasons)."""
    js = client.nc.jetstream(timeout=15)
    acked, refused = 0, []

    async def one(subject: str, data: bytes) -> None:
        nonlocal acked
        try:
            await js.publish(subject, data, headers={"Nats-Msg-Id": uuid.uuid4().hex})
        except nats.js.errors.APIError as exc:
            refused.append(str(exc.description))
        else:
            acked += 1

    for i in range(0, len(messages), 256):
        await asyncio.gather(*(one(s, d) for s, d in messages[i : i + 256]))
    return acked, refused


async def stored(system: System, stream: str) -> dict[str, int]:
    async def get(js: Any) -> dict[str, int]:
        info = await js.stream_info(stream)
        return {"bytes": int(info.state.bytes), "messages": int(info.state.messages)}

    result: dict[str, int] = await admin_js(system, get)
    return result


async def kept_of(system: System, minion: str) -> dict[str, int]:
    """What the server keeps of a node's logs, wherever it keeps them: its messages per
    subject (the stream that holds `log.<minion>.>`, asked of the server)."""

    async def get(js: Any) -> dict[str, int]:
        where = f"{subjects.LOGS}.{minion}.>"
        stream = await js.find_stream_name_by_subject(f"{subjects.LOGS}.{minion}.x.0")
        info = await js.stream_info(stream, subjects_filter=where)
        return {str(k): int(v) for k, v in (info.state.subjects or {}).items()}

    result: dict[str, int] = await admin_js(system, get)
    return result


async def test_an_account_flooding_its_nodes_logs_pushes_no_other_accounts_log_out(
    system: System, victim: Victim, eve: Path, tmp_path: Path
) -> None:
    """The attacker enrols two nodes and floods from both: twice a node's budget in chunks
    of 64 KiB under job ids it makes up (no per-subject limit bounds those) and some for the
    victim's job id, then twice a node's message count in one-byte chunks. Each of its
    nodes keeps at most its budget (its own oldest chunks going first), the account at most
    its nodes' budgets; the victim node's log stream keeps every chunk it had, and the
    victim's `job logs` still shows its line and none of the attacker's."""
    minions = [f"mal-logs-{n}" for n in (1, 2)]
    nodes = [await enrolled_node(system, eve, m, tmp_path / f"{m}.creds") for m in minions]
    before = await kept_of(system, VICTIM_NODE)
    assert before  # the victim's job printed its line
    injected = b"INJECTED: your job is compromised\n"

    async def from_node(minion: str, creds: Creds) -> tuple[int, list[str]]:
        big = [
            (subjects.log(minion, uuid.uuid4().hex[:12], 0), b"x" * 64 * KIB)
            for _ in range(2 * NODE_LOG_MAX_BYTES // (64 * KIB))
        ]
        big += [(subjects.log(minion, victim.job_id, 0), injected)] * 8
        tiny = [(subjects.log(minion, f"t{n}", 0), b".") for n in range(2 * NODE_LOG_MAX_MSGS)]
        async with Client(system.nats.url, creds, name=minion) as node:
            acked, refused = await flood(node, big)
            more, refused_more = await flood(node, tiny)
        return acked + more, refused + refused_more

    results = await asyncio.gather(*(from_node(m, c) for m, c in zip(minions, nodes, strict=True)))
    assert all(refused == [] for _, refused in results)  # taken: old chunks make room

    for minion in minions:
        kept = await kept_of(system, minion)
        tiny = sum(n for subject, n in kept.items() if subject.split(".")[4].startswith("t"))
        big = sum(kept.values()) - tiny
        assert big * 64 * KIB + tiny <= NODE_LOG_MAX_BYTES, (minion, big, tiny)
        assert big + tiny <= NODE_LOG_MAX_MSGS, (minion, big, tiny)
        held = await stored(system, node_logs(minion))  # its own stream, within its limits
        assert held["bytes"] <= NODE_LOG_MAX_BYTES and held["messages"] <= NODE_LOG_MAX_MSGS
    assert await kept_of(system, VICTIM_NODE) == before
    logs = (await asyncio.to_thread(system.cli, "job", "logs", victim.job_id)).stdout
    assert victim.secret in logs and "INJECTED" not in logs
    await victim.assert_untouched()


@contextmanager
def paused(system: System, name: str) -> Iterator[None]:
    """`name` stopped (SIGSTOP) meanwhile: nobody reads what the nodes report."""
    pid = system.procs[name].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@asynccontextmanager
async def as_node(system: System, minion: str) -> AsyncIterator[Client]:
    """A node credential of the attacker's account for `minion` (enrolled nowhere)."""
    creds = system.nats.creds("node", minion, account=ATTACKER_ACCOUNT)
    async with Client(system.nats.url, creds, name=minion) as node:
        yield node


def forged_end(victim: Victim, minion: str) -> tuple[str, bytes, dict[str, str]]:
    """`minion` says the victim's running worker finished: a fact of a worker not its own."""
    p = victim.placements[0]
    msg = WorkerFinished(
        job_id=victim.job_id,
        worker=0,
        placement_id=str(p["placement_id"]),
        minion_id=minion,
        state=WorkerState.finished,
        exit_code=0,
        ended_at=datetime.now(UTC),
    )
    return msg.subject(), msg.to_bytes(), envelope_for(msg, source="attacker").headers()


async def test_a_node_flooding_its_reports_holds_only_its_own_queue_and_nothing_is_kept(
    system: System, victim: Victim
) -> None:
    """While the scheduler reads nothing (stopped), a node sends 1,200 ends of the victim's
    worker on its own subject: 1,000 are queued, the rest refused to it; another node's
    report still goes in. The scheduler, back, reads them all and keeps none: nothing of
    either node is in the event history, REPORTS holds none of them, one dead letter names
    each node and why (not one per report), and the victim's job runs on, unbilled."""
    flooder, other = f"mal-rep-{uuid.uuid4().hex[:6]}", f"mal-rep-{uuid.uuid4().hex[:6]}"
    events_before = (await stream_state(system, subjects.STREAM_EVENTS))["last_seq"]
    subject, data, headers = forged_end(victim, flooder)
    with paused(system, "scheduler"):
        async with as_node(system, flooder) as node:
            js = node.nc.jetstream(timeout=15)

            async def one(_: int) -> str:
                try:
                    await js.publish(
                        subject, data, headers={**headers, "Nats-Msg-Id": uuid.uuid4().hex}
                    )
                except nats.js.errors.APIError as exc:
                    return str(exc.description)
                return "acked"

            answers = await asyncio.gather(*(one(n) for n in range(REPORTS_PER_SUBJECT + 200)))
        async with as_node(system, other) as node:
            theirs, their_data, their_headers = forged_end(victim, other)
            ack = await node.nc.jetstream(timeout=15).publish(
                theirs, their_data, headers=their_headers
            )
    assert answers.count("acked") == REPORTS_PER_SUBJECT, answers.count("acked")
    assert answers.count("maximum messages per subject exceeded") == 200
    assert ack.stream == REPORTS  # another node's still goes in, to be read

    async def all_read() -> bool:
        return (await stored(system, REPORTS))["messages"] == 0

    await wait_for_async(all_read, timeout=60, interval=0.5, message="reports never read")
    for minion in (flooder, other):
        kept = f"{subjects.EVENTS}.worker.kept.finished.{minion}"
        assert await last_seq(system, subjects.STREAM_EVENTS, kept) is None
    assert not await events_naming(system, events_before, (flooder, other))

    async def noticed() -> list[dict[str, Any]]:
        return [r for r in await dead_letters(system) if r.get("node") in (flooder, other)]

    await wait_for_async(lambda: _two(noticed), timeout=10, message="no dead letters")
    records = await noticed()
    assert sorted(r["node"] for r in records) == sorted([flooder, other])
    assert all(r["errors"][0]["rule"] == "worker:not-placed-on-node" for r in records)
    await victim.assert_untouched()


async def _two(noticed: Any) -> bool:
    return len(await noticed()) >= 2


async def events_naming(system: System, after: int | None, minions: tuple[str, ...]) -> list[str]:
    """Event history messages stored after sequence `after` that name one of `minions`."""

    async def read(js: Any) -> list[str]:
        info = await js.stream_info(subjects.STREAM_EVENTS)
        found = []
        for seq in range((after or 0) + 1, int(info.state.last_seq) + 1):
            try:
                msg = await js.get_msg(subjects.STREAM_EVENTS, seq)
            except nats.js.errors.NotFoundError:
                continue
            text = f"{msg.subject} {(msg.data or b'').decode(errors='replace')}"
            found += [text for m in minions if m in text]
        return found

    result: list[str] = await admin_js(system, read)
    return result


async def dead_letters(system: System) -> list[dict[str, Any]]:
    """Every dead letter of the scheduler, as an operator reads them."""

    async def read(js: Any) -> list[dict[str, Any]]:
        sub = await js.subscribe(
            subjects.dead_letter("scheduler", "*"),
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        out = []
        try:
            while True:
                try:
                    out.append(json.loads((await sub.next_msg(timeout=0.5)).data))
                except (TimeoutError, nats.errors.TimeoutError):
                    return out
        finally:
            await sub.unsubscribe()

    result: list[dict[str, Any]] = await admin_js(system, read)
    return result
