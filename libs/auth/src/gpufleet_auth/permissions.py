"""Least privilege as data: what each identity may publish and subscribe to.

One row per kind of identity. The NATS server enforces these (they are written into each
user JWT), so a forged command, event or read is refused before any gpufleet code sees it;
handlers still check who may state a fact (defence in depth). `docs/permissions.md` is
generated from this table (`just docs`), and tests/unit/auth checks that every subject each
service's wiring subscribes to or publishes is allowed by its row, and that nothing else
crosses an account.

Placeholders: `{account}` (a tenant account), `{minion_id}` (a node), `{inbox}` (the
identity's own reply inbox: `_INBOX.account.<account>.<its public key>` for a user,
`_INBOX.node.<minion_id>.<key>` for a node, `_INBOX.enroll.<minion_id>.<key>` for a join
token, `_INBOX.<key>` for a service or an operator). A service answers an account's request
only under that account's inboxes (gpufleet_bus.accounts.reply_scope): the scope is what
the request's subject proves, so nobody can aim an answer at another account's inbox.

JetStream: consuming a stream needs its API subjects, not the stream's subjects. A service
gets the API of the streams it reads (never purge or delete of a stream or a message, but
the provisioner's of a node's own log stream, made and deleted with the node); a
node agent gets only "next message" and "ack" on the one consumer the provisioner created
for it at enrolment, so it can read its own commands and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpufleet_contracts import subjects as s

S = s.ROOT
EVENTS, COMMANDS, LOGS, DLQ = s.STREAM_EVENTS, s.STREAM_COMMANDS, s.STREAM_LOGS, s.STREAM_DLQ
REPORTS = s.STREAM_REPORTS
STREAMS = (EVENTS, COMMANDS, REPORTS, DLQ)
# Each node's log stream is its own, GPUFLEET_LOGS_<minion_id>; a stream name is one token
# of the API subjects, so "every node's log stream" can only be written as any stream.
ANY_STREAM = "*"
INBOX = "{inbox}.>"


@dataclass(frozen=True)
class Grant:
    """What one identity may do. `responses`: it may answer requests it received (the
    reply subject is allowed for one message), without any publish right on inboxes."""

    kind: str
    summary: str
    pub: tuple[str, ...] = ()
    sub: tuple[str, ...] = ()
    pub_deny: tuple[str, ...] = ()
    responses: bool = False
    notes: tuple[str, ...] = field(default=())

    def bind(self, **values: str) -> Grant:
        def fill(items: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(i.format(**values) for i in items)

        return replace(self, pub=fill(self.pub), sub=fill(self.sub), pub_deny=fill(self.pub_deny))

    def nats_claims(self) -> dict[str, object]:
        """The `pub`/`sub`/`resp` part of a user JWT's `nats` claims."""
        claims: dict[str, object] = {
            "pub": {
                "allow": list(self.pub),
                **({"deny": list(self.pub_deny)} if self.pub_deny else {}),
            },
            "sub": {"allow": list(self.sub)},
        }
        if self.responses:
            claims["resp"] = {"max": 1, "ttl": 0}
        return claims

    def may_publish(self, subject: str) -> bool:
        return covered(subject, self.pub) and not any(overlaps(subject, d) for d in self.pub_deny)

    def may_subscribe(self, subject: str) -> bool:
        return covered(subject, self.sub)


# --- JetStream API building blocks -----------------------------------------------------


def declare_streams() -> tuple[str, ...]:
    """Create a missing gpufleet stream and read their configuration (every service
    declares them at start-up). Never update one: an operator does (`just up`)."""
    out = ["$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST"]
    for stream in STREAMS:
        out += [f"$JS.API.STREAM.{op}.{stream}" for op in ("INFO", "CREATE")]
    return tuple(out)


def consume(stream: str) -> tuple[str, ...]:
    """Durable and ordered consumers on one stream (create, info, next, delete: the action
    is one or two tokens before the stream) and acks."""
    return (
        f"$JS.API.CONSUMER.*.{stream}",
        f"$JS.API.CONSUMER.*.{stream}.>",
        f"$JS.API.CONSUMER.*.*.{stream}.>",
        f"$JS.ACK.{stream}.>",
    )


NEVER = (
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.STREAM.SNAPSHOT.>",
    "$JS.API.STREAM.RESTORE.>",
    "$JS.API.ACCOUNT.>",
    "$JS.API.META.>",
    "$JS.API.SERVER.>",
)


def node_log_streams() -> tuple[str, ...]:
    """Make, apply limits to and delete nodes' log streams (the provisioner, at enrolment and
    revocation): any stream's API, but the shared streams' update and delete (denied)."""
    return tuple(f"$JS.API.STREAM.{op}.*" for op in ("CREATE", "UPDATE", "INFO", "DELETE"))


# The provisioner's denials: NEVER, but a stream's deletion is denied for the shared ones
# only (a node's log stream goes with the node); they are not updated either.
NEVER_BUT_NODE_LOGS = (
    *(n for n in NEVER if n != "$JS.API.STREAM.DELETE.>"),
    *(f"$JS.API.STREAM.{op}.{stream}" for stream in STREAMS for op in ("DELETE", "UPDATE")),
)


def _service(
    name: str,
    summary: str,
    *,
    pub: tuple[str, ...],
    reads: tuple[str, ...],
    sub: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    never: tuple[str, ...] = NEVER,
) -> Grant:
    """A service: its own requests (any account's, and the operators' verbs), its events,
    its dead letters, and the JetStream API of the streams it reads."""
    js = declare_streams() + tuple(x for stream in (*reads, DLQ) for x in consume(stream))
    return Grant(
        kind=f"service:{name}",
        summary=summary,
        pub=(*pub, f"{S}.dlq.{name}.*", *js, *extra, "_INBOX.>"),
        sub=(
            f"{S}.rpc.{name}.*.*",
            f"{S}.adm.{name}.*",
            f"{S}.internal.{name}.>",
            *sub,
            INBOX,
        ),
        pub_deny=never,
        # Replies go to inboxes (the `_INBOX.>` allow above). No `resp` permission: the
        # server would then let a service answer any reply subject a requester chose,
        # `$JS.API...` included, past the denials (and the bus answers only inboxes).
    )


SERVICES: dict[str, Grant] = {
    "scheduler": _service(
        "scheduler",
        "jobs, the queue and placement; the only sender of StartWorker/StopWorker",
        pub=(
            f"{S}.evt.job.*",
            f"{S}.evt.worker.placed",
            # the reports it takes, and a worker of a lost node declared failed (R-NODE-5)
            f"{S}.evt.worker.kept.*.*",
            f"{S}.evt.scheduler.*",
            f"{S}.cmd.node.*.start_worker",
            f"{S}.cmd.node.*.stop_worker",
            f"{S}.internal.scheduler.>",
            # a platform object's URL for a placement's node, its upload done (datastore)
            f"{S}.svc.datastore.grant_platform_object",
            f"{S}.svc.datastore.complete_platform_object",
            # a job's `local` data relayed through the store (`job connect`, its nodes)
            f"{S}.svc.datastore.grant_relay",
            f"{S}.svc.datastore.complete_relay",
            f"{S}.svc.datastore.list_relayed",
            # which configurations a device asking for its attached keys was told to run
            f"{S}.svc.device-fleet.configs_told",
        ),
        # a node's requests for its placements' platform objects; a device's for its keys
        sub=(f"{S}.nrpc.scheduler.*.*",),
        # every node's log stream (`job_logs`), hence any stream
        reads=(EVENTS, COMMANDS, REPORTS, ANY_STREAM),
    ),
    "provisioner": _service(
        "provisioner",
        "providers, regions, nodes and node enrolment; makes each node's command consumer and "
        "log stream",
        pub=(
            f"{S}.evt.node.*",
            f"{S}.evt.provider.*",
            f"{S}.evt.account.*",
            f"{S}.evt.alert.*",  # alerts fired and resolved (its alert rules)
            f"{S}.node.*.*",  # asks a node agent for its health
            f"{S}.cmd.node.*.verify_gpus",  # asks a node for its GPU check
        ),
        reads=(EVENTS, COMMANDS, REPORTS),
        # the console gateway redeeming a sign-in code (only it and operators may ask)
        sub=(
            f"{S}.enroll.*",
            f"{S}.hb.*",
            f"{S}.svc.provisioner.redeem_console_code",
            f"{S}.svc.provisioner.end_console_session",  # the gateway at a sign-out
            # a region's and a node's facts for regional resources (the datastore service's)
            f"{S}.svc.provisioner.region_facts",
            f"{S}.svc.provisioner.node_facts",
            # a device's join token (only device-fleet asks, for the acting account's device)
            f"{S}.svc.provisioner.issue_device_join_token",
        ),
        extra=node_log_streams(),
        never=NEVER_BUT_NODE_LOGS,
    ),
    "billing": _service(
        "billing",
        "the ledger; the only sender of billing events",
        pub=(f"{S}.evt.billing.*",),
        reads=(EVENTS,),
    ),
    "device-fleet": _service(
        "device-fleet",
        "edge devices, their configurations and rollouts; the only sender of a device's "
        "configuration",
        pub=(
            f"{S}.evt.device.*",
            f"{S}.cmd.node.*.apply_device_config",
            # a device's region (R-DEV-1, R-NODE-3) and its join token, asked of the provisioner
            f"{S}.svc.provisioner.region_facts",
            f"{S}.svc.provisioner.issue_device_join_token",
        ),
        # the devices' own reports (evt.device.status.<minion_id>)
        reads=(EVENTS, REPORTS),
        # the devices' heartbeats (hb.device.<minion_id>); a region's device count, asked by
        # the datastore service (R-RES-1), and who a device asking to mount a datastore is
        sub=(
            f"{S}.hb.device.*",
            f"{S}.svc.device-fleet.region_devices",
            f"{S}.svc.device-fleet.device_facts",
            # the scheduler, sealing a device's keys or granting its checkpoints
            f"{S}.svc.device-fleet.configs_told",
        ),
    ),
    "datastore": _service(
        "datastore",
        "regional datastores and platform objects; grants a platform object's URL to the "
        "scheduler only",
        # asks the provisioner for a region's nodes and its owner's plan (R-RES-1, R-TEN-3),
        # and who a node asking to mount a datastore is
        pub=(
            f"{S}.evt.datastore.*",
            f"{S}.svc.provisioner.region_facts",
            f"{S}.svc.provisioner.node_facts",
            f"{S}.svc.device-fleet.region_devices",  # a region's devices (R-RES-1)
            f"{S}.svc.device-fleet.device_facts",  # a device asking to mount one
        ),
        reads=(EVENTS,),
        # a node's request for a datastore of its region (nrpc.datastore.<verb>.<minion_id>)
        sub=(f"{S}.svc.datastore.*", f"{S}.nrpc.datastore.*.*"),
    ),
}


NODE = Grant(
    kind="node",
    summary="one node agent: only subjects carrying its own minion id",
    pub=(
        f"{S}.cmd.provisioner.{{minion_id}}.register_node",
        f"{S}.evt.worker.started.{{minion_id}}",
        f"{S}.evt.worker.uploading.{{minion_id}}",
        f"{S}.evt.worker.staging.{{minion_id}}",
        f"{S}.evt.worker.finished.{{minion_id}}",
        # the endpoints it serves: answering through its proxy, and their requests counted
        f"{S}.evt.worker.endpoint_ready.{{minion_id}}",
        f"{S}.evt.worker.endpoint_metered.{{minion_id}}",
        f"{S}.evt.node.gpu_checked.{{minion_id}}",  # its answer to a GPU check
        f"{S}.hb.{{minion_id}}",
        f"{S}.log.{{minion_id}}.>",
        f"{S}.dlq.node-{{minion_id}}._",  # a node's dead letters name no account
        # its placements' platform objects, asked of the scheduler (answered to its inbox)
        f"{S}.nrpc.scheduler.stage_platform_object.{{minion_id}}",
        f"{S}.nrpc.scheduler.complete_platform_upload.{{minion_id}}",
        # its placements' `local` data, relayed from and to the user's machine
        f"{S}.nrpc.scheduler.stage_local_data.{{minion_id}}",
        f"{S}.nrpc.scheduler.complete_local_upload.{{minion_id}}",
        # a datastore of its region to mount, its SMB password sealed to this node; a port
        # reservation of its region to publish with mDNS
        f"{S}.nrpc.datastore.mount_datastore.{{minion_id}}",
        f"{S}.nrpc.datastore.node_reservation.{{minion_id}}",
        # whether a key a caller presented opens an endpoint it serves
        f"{S}.nrpc.scheduler.verify_endpoint_key.{{minion_id}}",
        f"$JS.API.CONSUMER.INFO.{COMMANDS}.node-{{minion_id}}",
        f"$JS.API.CONSUMER.MSG.NEXT.{COMMANDS}.node-{{minion_id}}",
        f"$JS.ACK.{COMMANDS}.node-{{minion_id}}.>",
    ),
    sub=(f"{S}.node.{{minion_id}}.*", INBOX),
    responses=True,
)

DEVICE = Grant(
    kind="device",
    summary="one edge device's agent: only its own device's subjects",
    pub=(
        f"{S}.evt.device.status.{{minion_id}}",
        f"{S}.hb.device.{{minion_id}}",  # never a compute node's hb.<minion_id>
        # its configuration's datastore, of its own region and owner (no SMB: no sealing key)
        f"{S}.nrpc.datastore.mount_datastore.{{minion_id}}",
        # its configuration's attached keys, sealed to a key of its own (R-DEV-2)
        f"{S}.nrpc.scheduler.device_keys.{{minion_id}}",
        # its configuration's checkpoints: a read grant of its owner's, named by it (R-DEV-2)
        f"{S}.nrpc.scheduler.stage_device_checkpoint.{{minion_id}}",
        f"{S}.dlq.node-{{minion_id}}._",
        f"$JS.API.CONSUMER.INFO.{COMMANDS}.node-{{minion_id}}",
        f"$JS.API.CONSUMER.MSG.NEXT.{COMMANDS}.node-{{minion_id}}",
        f"$JS.ACK.{COMMANDS}.node-{{minion_id}}.>",
    ),
    sub=(f"{S}.node.{{minion_id}}.*", INBOX),
    responses=True,
    notes=(
        "reads its configuration from its own command consumer (made at enrolment) and "
        "reports on its own status subject; never a worker's, a log's or a request's subject",
    ),
)

ENROLL = Grant(
    kind="enroll",
    summary="a join token: one request to exchange it for a node credential, then nothing",
    pub=(f"{S}.enroll.{{minion_id}}",),
    sub=(INBOX,),
)

USER = Grant(
    kind="user",
    summary="a user of an account: its own account's requests, nothing else",
    pub=(
        f"{S}.rpc.*.*.{{account}}",
        f"{S}.cmd.scheduler.{{account}}.enqueue_job",
    ),
    sub=(INBOX,),
    notes=(
        "reads its jobs, logs and dead letters through requests the services answer "
        "for its account only; no event, command, log or JetStream API subject",
    ),
)

OPERATOR = Grant(
    kind="operator",
    summary="an operator of the installation: everything, including the JetStream API",
    pub=(">",),
    sub=(">",),
    responses=True,
)

GATEWAY = Grant(
    kind="gateway",
    summary="the web console's gateway: redeems sign-in codes and ends their sessions at "
    "sign-out, nothing else; each person's requests go on that person's own short-lived "
    "credential",
    pub=(
        f"{S}.svc.provisioner.redeem_console_code",
        f"{S}.svc.provisioner.end_console_session",
    ),
    sub=(INBOX,),
    notes=(
        "a redeemed code gives the gateway the short-lived credential of the person who "
        "asked for it (`gpufleet console login`): a user's of that account, or an "
        "operator's; it never acts for an account on its own identity",
    ),
)

# In the system account: the provisioner's right to push a new account JWT (revocations).
CLAIMS_PUSHER = Grant(
    kind="system:claims",
    summary="pushes the account JWT when a credential is revoked (system account)",
    pub=("$SYS.REQ.CLAIMS.UPDATE", "$SYS.REQ.ACCOUNT.*.CLAIMS.UPDATE"),
    sub=(INBOX,),
)


def for_service(name: str, inbox: str) -> Grant:
    return SERVICES[name].bind(inbox=inbox)


def for_node(minion_id: str, inbox: str) -> Grant:
    return NODE.bind(minion_id=minion_id, inbox=inbox)


def for_device(minion_id: str, inbox: str) -> Grant:
    return DEVICE.bind(minion_id=minion_id, inbox=inbox)


def for_enroll(minion_id: str, inbox: str) -> Grant:
    return ENROLL.bind(minion_id=minion_id, inbox=inbox)


def for_user(account: str, inbox: str) -> Grant:
    return USER.bind(account=account, inbox=inbox)


def for_operator(inbox: str) -> Grant:
    return OPERATOR.bind(inbox=inbox)


def for_gateway(inbox: str) -> Grant:
    return GATEWAY.bind(inbox=inbox)


def table() -> list[Grant]:
    """Every row, with its placeholders, in the order the docs show them."""
    return [*SERVICES.values(), NODE, DEVICE, ENROLL, USER, OPERATOR, GATEWAY, CLAIMS_PUSHER]


# --- subject matching (NATS wildcard semantics) ----------------------------------------


def matches(subject: str, pattern: str) -> bool:
    """Whether a literal `subject` matches `pattern` (`*` one token, `>` the rest)."""
    return overlaps(subject, pattern) and "*" not in subject and ">" not in subject


def covered(subject: str, patterns: tuple[str, ...]) -> bool:
    """Whether every subject `subject` (which may hold wildcards) can stand for is allowed
    by one of `patterns`: a subscription to `a.*` needs a pattern covering all of `a.*`."""
    return any(_covers(p.split("."), subject.split(".")) for p in patterns)


def overlaps(subject: str, pattern: str) -> bool:
    """Whether some literal subject matches both (wildcards allowed on either side)."""
    a, b = subject.split("."), pattern.split(".")
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == ">" or y == ">":
            return True
        if x != y and "*" not in (x, y):
            return False
        if i == min(len(a), len(b)) - 1 and len(a) != len(b):
            return False
    return len(a) == len(b)


def _covers(pattern: list[str], subject: list[str]) -> bool:
    for i, p in enumerate(pattern):
        if p == ">":
            return len(subject) > i
        if i >= len(subject):
            return False
        t = subject[i]
        if t == ">":
            return False
        if p != "*" and (t == "*" or p != t):
            return False
    return len(subject) == len(pattern)


# --- what the docs say: who may publish and who may read a subject ---------------------

SAMPLE = {"account": "acme", "minion_id": "m1", "inbox": "_INBOX.UKEY"}


def _sample(subject: str) -> str:
    """A literal subject standing for a documented one (`{minion_id}`, `*`: sample tokens)."""
    out = subject.format(**SAMPLE) if "{" in subject else subject
    return ".".join("acme" if t == "*" else t for t in out.split("."))


def _label(grant: Grant) -> str:
    return {
        "node": "node (its own)",
        "device": "device (its own)",
        "user": "user (its own account)",
    }.get(grant.kind, grant.kind.removeprefix("service:"))


def who_may(subject: str, stream: str | None) -> tuple[list[str], list[str]]:
    """(may publish, may read) for a documented subject; reading a stream subject means
    having that stream's consumer API (or, for a node, its own consumer)."""
    literal = _sample(subject)
    publishers: list[str] = []
    readers: list[str] = []
    for row in table():
        if row.kind.startswith("system"):
            continue
        grant = row.bind(**SAMPLE)
        if grant.may_publish(literal):
            publishers.append(_label(row))
        if stream is None:
            if grant.may_subscribe(literal):
                readers.append(_label(row))
        elif grant.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.any") or (
            row.kind in ("node", "device")
            and stream == COMMANDS
            and literal.startswith(f"{S}.cmd.node.{SAMPLE['minion_id']}.")
        ):
            readers.append(_label(row))
    return publishers, readers


def markdown() -> str:
    """docs/permissions.md."""
    lines = [
        "# Permissions",
        "",
        "Generated by `just docs` from `libs/auth/src/gpufleet_auth/permissions.py`; do not",
        "edit by hand. The NATS server enforces these: each row is written into the JWT of",
        "every credential of that kind. `{account}`, `{minion_id}` are the identity's own;",
        "`{inbox}` is `_INBOX.<scope>.<its public key>`: scope `account.<account>` (a user),",
        "`node.<minion_id>`, `enroll.<minion_id>` (a join token), none (a service, an",
        "operator). Services answer an account's request only under `_INBOX.account.<account>`.",
        "Denials win over allows.",
        "",
    ]
    for g in table():
        lines += [f"## {g.kind}", "", g.summary + ".", ""]
        lines.append("| | subjects |")
        lines.append("|---|---|")
        lines.append(f"| publish | {', '.join(f'`{p}`' for p in g.pub) or '(none)'} |")
        if g.pub_deny:
            lines.append(f"| never publish | {', '.join(f'`{p}`' for p in g.pub_deny)} |")
        lines.append(f"| subscribe | {', '.join(f'`{p}`' for p in g.sub) or '(none)'} |")
        lines.append(f"| answer requests it receives | {'yes' if g.responses else 'no'} |")
        lines.append("")
        lines += [f"{n[0].upper()}{n[1:]}." for n in g.notes]
        if g.notes:
            lines.append("")
    return "\n".join(lines)
