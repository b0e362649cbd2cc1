"""The subject scheme: every NATS subject gpufleet uses is built here.

    gpufleet.v1.evt.<domain>.<event>            events (JetStream stream EVENTS)
    gpufleet.v1.evt.worker.<fact>.<minion_id>   a node's report of its worker (stream REPORTS)
    gpufleet.v1.evt.worker.kept.<fact>.<minion_id>  a report the scheduler took (stream EVENTS)
    gpufleet.v1.cmd.<domain>.<key>.<verb>       durable commands (JetStream stream COMMANDS)
    gpufleet.v1.rpc.<service>.<verb>.<account>  an account's request/reply (core NATS)
    gpufleet.v1.adm.<service>.<verb>            an operator's request/reply (core NATS)
    gpufleet.v1.enroll.<minion_id>              a node exchanging its join token (core NATS)
    gpufleet.v1.node.<minion_id>.<verb>         requests to one node agent (core NATS)
    gpufleet.v1.nrpc.<service>.<verb>.<minion_id>  a node agent's request to a service (core NATS)
    gpufleet.v1.svc.<service>.<verb>            a service's request to another (core NATS)
    gpufleet.v1.log.<minion_id>.<job_id>.<worker>  worker log chunks (the node's own stream)
    gpufleet.v1.dlq.<service>.<account>         refused messages kept for inspection (stream DLQ)
    gpufleet.v1.hb.<minion_id>                  node heartbeats (core NATS: losing one is harmless)
    gpufleet.v1.hb.device.<minion_id>           device heartbeats (core NATS, device-fleet's)
    _INBOX.account.<account>.<public key>       a user's replies (an account's requests are
                                                answered only under _INBOX.account.<account>)
    _INBOX.node.<minion_id>.<public key>        a node agent's replies
    _INBOX.enroll.<minion_id>.<public key>      a join token's replies (its enrolment's answer)
    _INBOX.<public key>                         a service's or an operator's replies

`v1` is the version of the scheme itself; each message also carries its own version in
its CloudEvents type (`gpufleet.job.queued.v1`). A consumer subscribes to the subject of
the messages it handles; producers never guess subjects, they ask the message (`subject()`).

Who is speaking is part of the subject wherever it matters, and the NATS server's permissions
(gpufleet_auth.permissions) decide who may publish there: a user of account `acme` may
publish only `gpufleet.v1.rpc.*.*.acme`, a node agent only subjects carrying its own
`minion_id`. So a service reads the acting account, or the reporting node, from the subject
the server let through, never from a payload or a header (R-TEN-2).
"""

from __future__ import annotations

import re

ROOT = "gpufleet.v1"
EVENTS = f"{ROOT}.evt"
COMMANDS = f"{ROOT}.cmd"
RPC = f"{ROOT}.rpc"
LOGS = f"{ROOT}.log"
DLQ = f"{ROOT}.dlq"
HEARTBEATS = f"{ROOT}.hb"
ADMIN = f"{ROOT}.adm"
ENROLL = f"{ROOT}.enroll"
NODES = f"{ROOT}.node"
INTERNAL = f"{ROOT}.internal"
NODE_RPC = f"{ROOT}.nrpc"
SERVICE_CALLS = f"{ROOT}.svc"
# Headers this project defines (CloudEvents' own `ce-*` are in base.Envelope).
# No header carries an identity: the acting account is a subject token (see above).
# W3C trace context (https://www.w3.org/TR/trace-context/): every message of a job's work
# carries its trace (gpufleet_bus.tracing); one from an account's request is not followed.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
NO_ACCOUNT = "_"  # the account token of a dead letter whose account is unknown
# An account name or a minion id is one subject token: letters, digits, '-', '_'.
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

# JetStream streams: name -> subjects. Declared once, by every service at start-up (idempotent).
STREAM_EVENTS = "GPUFLEET_EVENTS"
STREAM_COMMANDS = "GPUFLEET_COMMANDS"
STREAM_LOGS = "GPUFLEET_LOGS"  # each node's log stream is GPUFLEET_LOGS_<minion_id>
STREAM_DLQ = "GPUFLEET_DLQ"
STREAM_REPORTS = "GPUFLEET_REPORTS"


def event(domain: str, name: str) -> str:
    return f"{EVENTS}.{domain}.{name}"


def command(domain: str, verb: str, key: str = "{minion_id}") -> str:
    return f"{COMMANDS}.{domain}.{key}.{verb}"


def rpc(service: str, verb: str) -> str:
    """The base of an account request; `as_account` adds the account token."""
    return f"{RPC}.{service}.{verb}"


def as_account(base: str, account: str) -> str:
    """`gpufleet.v1.rpc.billing.balance` asked by `acme`: `gpufleet.v1.rpc.billing.balance.acme`."""
    return f"{base}.{account}"


def rpc_account(subject: str) -> str | None:
    """The acting account of an account request (its last token), or None if not one."""
    parts = subject.split(".")
    if len(parts) != 6 or f"{parts[0]}.{parts[1]}.{parts[2]}" != RPC:
        return None
    return parts[5] or None


def admin(service: str, verb: str) -> str:
    """An operator's request: only operator credentials may publish these."""
    return f"{ADMIN}.{service}.{verb}"


def enroll(minion_id: str) -> str:
    return f"{ENROLL}.{minion_id}"


def node(minion_id: str, verb: str) -> str:
    """A request to one node agent (its health)."""
    return f"{NODES}.{minion_id}.{verb}"


def node_request(service: str, verb: str) -> str:
    """The base of a node agent's request to `service`; `as_node` adds the node's token, which
    only that node's credential may publish (the service reads the asking node from it)."""
    return f"{NODE_RPC}.{service}.{verb}"


def as_node(base: str, minion_id: str) -> str:
    return f"{base}.{minion_id}"


def node_rpc_node(subject: str) -> str | None:
    """The asking node of a node's request (its last token), or None if not one."""
    parts = subject.split(".")
    if len(parts) != 6 or ".".join(parts[:3]) != NODE_RPC:
        return None
    return parts[5] or None


def service_call(service: str, verb: str) -> str:
    """A service's request to another: the permission table names which service may publish
    each (e.g. only the scheduler asks the datastore for a platform object's URL)."""
    return f"{SERVICE_CALLS}.{service}.{verb}"


def log(minion_id: str, job_id: str, worker: int) -> str:
    """A worker's log chunks, on the subject of the node that ran it: a node can only write
    its own, and a reader takes each worker's log from the node its placement named."""
    return f"{LOGS}.{minion_id}.{job_id}.{worker}"


def node_logs_stream(minion_id: str) -> str:
    """The stream of one node's log chunks (`log.<minion_id>.>`): what a node can store is
    bounded by its own stream's limits, and no node's output can push another's out."""
    return f"{STREAM_LOGS}_{minion_id}"


def kept(fact: str, minion_id: str) -> str:
    """Where the scheduler states a node's report it took (`started`, `uploading`,
    `finished`): a fact of a worker that node runs, in the event history. The node's own subject
    (`evt.worker.<fact>.<minion_id>`) goes to the REPORTS stream, which keeps nothing once
    the scheduler has read it."""
    return f"{WORKER_KEPT}.{fact}.{minion_id}"


def dead_letter(service: str, account: str | None = None) -> str:
    """Where `service` keeps a refused message; the account it was acting for, if known."""
    return f"{DLQ}.{service}.{account or NO_ACCOUNT}"


def internal(service: str, name: str) -> str:
    """Between the instances of one service (core NATS), e.g. the scheduler's sync."""
    return f"{INTERNAL}.{service}.{name}"


def heartbeat(minion_id: str) -> str:
    return f"{HEARTBEATS}.{minion_id}"


def token_at(subject: str, index: int) -> str | None:
    """Token `index` of `subject` (negative counts from the end), or None."""
    parts = subject.split(".")
    try:
        return parts[index] or None
    except IndexError:
        return None


def node_health(minion_id: str) -> str:
    """`gpufleet.v1.node.<minion_id>.health`: one agent's own health."""
    return node(minion_id, "health")


INBOX = "_INBOX"


def account_inbox(account: str) -> str:
    """`_INBOX.account.<account>`: the replies to `account`'s requests go only under it, each
    identity acting for the account (its users; an operator acting for it) having its own
    inbox there, `.<public key>`, the only one its credential may subscribe to."""
    return f"{INBOX}.account.{account}"


def node_inbox(minion_id: str) -> str:
    """`_INBOX.node.<minion_id>`: the inboxes of that node agent's credential."""
    return f"{INBOX}.node.{minion_id}"


def enroll_inbox(minion_id: str) -> str:
    """`_INBOX.enroll.<minion_id>`: the inboxes of the join tokens' credentials of that
    minion id; the provisioner answers an enrolment only there."""
    return f"{INBOX}.enroll.{minion_id}"


def wildcard(template: str) -> str:
    """A message's subject template with every `{key}` as `*`: what a consumer of every
    value of its keys subscribes to."""
    return re.sub(r"\{[^}]*\}", "*", template)


# Every worker fact (placed, started, finished) on one subject tree: each service reads them
# with one consumer, in stream order, dispatched by type (gpufleet_bus.runtime).
WORKER_EVENTS = f"{EVENTS}.worker.>"
# What nodes report of their workers (started, uploading, staging, finished, endpoint_ready,
# endpoint_metered: `<fact>.<minion_id>`), in the REPORTS stream: the scheduler's one
# consumer of them. The facts it takes go on `kept.<fact>.<minion_id>` (EVENTS), which
# billing reads with the scheduler's `placed`; staging (progress) and an endpoint's
# readiness and requests are shown, never kept.
WORKER_REPORTS = f"{EVENTS}.worker.*.*"
WORKER_KEPT = f"{EVENTS}.worker.kept"
# Core NATS between scheduler instances: "these jobs/nodes changed" from one that does not lead.
SCHEDULER_SYNC = internal("scheduler", "sync")
