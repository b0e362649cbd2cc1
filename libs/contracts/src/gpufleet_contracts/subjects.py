"""The subject scheme: every NATS subject gpufleet uses is built here.

    gpufleet.v1.evt.<domain>.<event>[.<key>]   events (JetStream stream EVENTS)
    gpufleet.v1.cmd.<domain>.<key>.<verb>      durable commands (JetStream stream COMMANDS)
    gpufleet.v1.rpc.<service>.<verb>           request/reply (core NATS; the CLI and health)
    gpufleet.v1.log.<job_id>.<worker>          worker log chunks (JetStream stream LOGS)
    gpufleet.v1.dlq.<service>                  rejected messages kept for inspection (stream DLQ)
    gpufleet.v1.hb.<minion_id>                 node heartbeats (core NATS: losing one is harmless)

`v1` is the version of the scheme itself; each message also carries its own version in
its CloudEvents type (`gpufleet.job.queued.v1`). A consumer subscribes to the subject of
the messages it handles; producers never guess subjects, they ask the message (`subject()`).
"""

from __future__ import annotations

ROOT = "gpufleet.v1"
EVENTS = f"{ROOT}.evt"
COMMANDS = f"{ROOT}.cmd"
RPC = f"{ROOT}.rpc"
LOGS = f"{ROOT}.log"
DLQ = f"{ROOT}.dlq"
HEARTBEATS = f"{ROOT}.hb"

# JetStream streams: name -> subjects. Declared once, by every service at start-up (idempotent).
STREAM_EVENTS = "GPUFLEET_EVENTS"
STREAM_COMMANDS = "GPUFLEET_COMMANDS"
STREAM_LOGS = "GPUFLEET_LOGS"
STREAM_DLQ = "GPUFLEET_DLQ"


def event(domain: str, name: str) -> str:
    return f"{EVENTS}.{domain}.{name}"


def command(domain: str, verb: str, key: str = "{minion_id}") -> str:
    return f"{COMMANDS}.{domain}.{key}.{verb}"


def rpc(service: str, verb: str) -> str:
    return f"{RPC}.{service}.{verb}"


def log(job_id: str, worker: int) -> str:
    return f"{LOGS}.{job_id}.{worker}"


def dead_letter(service: str) -> str:
    return f"{DLQ}.{service}"


def heartbeat(minion_id: str) -> str:
    return f"{HEARTBEATS}.{minion_id}"
