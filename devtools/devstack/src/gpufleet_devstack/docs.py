"""Generates what docs/ derives from the code: the AsyncAPI documents, the event catalogue,
the permissions table and the rule index.

    uv run python -m gpufleet_devstack.docs          # write docs/asyncapi/*.json, docs/*.md
    uv run python -m gpufleet_devstack.docs --check  # exit 1 if what is committed is stale

Each service's document comes from its own FastStream app, built by its composition root with
an unconnected broker: what the code subscribes to and publishes is what the document says.
The rule index (docs/rules.md) is gpufleet_devstack.rules.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faststream import FastStream
from gpufleet_bus import Service, Wired

from gpufleet_devstack import rules

ROOT = Path(__file__).resolve().parents[4]
DOCS = ROOT / "docs"


def _services() -> dict[str, Callable[[], Service[Any]]]:
    """Each service built as its `__main__` builds it (run_service), with brokers that are
    never connected: what the code wires is what the documents say."""
    from gpufleet_billing.app import build_app as billing
    from gpufleet_bus import Ports, make_broker
    from gpufleet_datastore.app import build_app as datastore
    from gpufleet_device_fleet.app import build_app as device_fleet
    from gpufleet_node_agent.app import build_app as node_agent
    from gpufleet_node_agent.device.app import build_device_app as device_agent
    from gpufleet_node_agent.device.settings import DeviceSettings
    from gpufleet_node_agent.settings import AgentSettings
    from gpufleet_provisioner.app import build_app as provisioner
    from gpufleet_scheduler.app import build_app as scheduler
    from gpufleet_store import Store

    def svc(name: str, build: Callable[[Ports], Service[Any]]) -> Callable[[], Service[Any]]:
        return lambda: build(Ports(broker=make_broker(name), store=Store.connect(name)))

    def agent() -> Service[Any]:
        # A placeholder minion id: each agent subscribes to its own node's command subjects.
        settings = AgentSettings(minion_id="MINION_ID")  # no inventory is read here
        return node_agent(Ports(broker=make_broker("node-agent")), settings)

    def device() -> Service[Any]:
        # the node agent in device mode (one edge device), the same placeholder minion id
        settings = DeviceSettings(minion_id="MINION_ID")
        return device_agent(Ports(broker=make_broker("device-agent")), settings)

    return {
        "scheduler": svc("scheduler", scheduler),
        "provisioner": svc("provisioner", provisioner),
        "billing": svc("billing", billing),
        "device-fleet": svc("device-fleet", device_fleet),
        "datastore": svc("datastore", datastore),
        "node-agent": agent,
        "device-agent": device,
    }


def _apps() -> dict[str, Callable[[], FastStream]]:
    def app_of(build: Callable[[], Service[Any]]) -> Callable[[], FastStream]:
        return lambda: build().app

    return {name: app_of(build) for name, build in _services().items()}


def asyncapi(app: FastStream) -> dict[str, Any]:
    spec = app.schema.to_specification()
    data: dict[str, Any] = json.loads(spec.to_json())
    return _trace_headers(_one_server(data))


def _trace_headers(data: dict[str, Any]) -> dict[str, Any]:
    """Every message may carry its job's W3C trace context (gpufleet_bus.tracing): one
    message trait with the two headers, named on each message."""
    from gpufleet_contracts import subjects

    trait = {
        "headers": {
            "type": "object",
            "properties": {
                subjects.TRACEPARENT: {
                    "type": "string",
                    "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
                    "description": "W3C traceparent of the job's trace; its sampled flag "
                    "decides whether the step makes a span. Not followed on an account's "
                    "request.",
                },
                subjects.TRACESTATE: {
                    "type": "string",
                    "maxLength": 512,
                    "description": "W3C tracestate, carried along with the traceparent.",
                },
            },
        }
    }
    components = data.setdefault("components", {})
    components.setdefault("messageTraits", {})["TraceContext"] = trait
    for message in components.get("messages", {}).values():
        message["traits"] = [{"$ref": "#/components/messageTraits/TraceContext"}]
    return data


def _one_server(data: dict[str, Any]) -> dict[str, Any]:
    """A service's fast-path subjects are declared on a second, never-connected broker with
    the same servers (gpufleet_bus.fastpath); FastStream lists each broker's servers, so
    identical ones are folded back into the one "development" server."""
    servers = data.get("servers") or {}
    if len(servers) < 2 or len({json.dumps(v, sort_keys=True) for v in servers.values()}) > 1:
        return data
    text = json.dumps(data)
    for name in servers:
        text = text.replace(f'"#/servers/{name}"', '"#/servers/development"')
    folded: dict[str, Any] = json.loads(text)
    folded["servers"] = {"development": next(iter(servers.values()))}
    for channel in folded.get("channels", {}).values():
        refs = channel.get("servers")
        if refs:
            channel["servers"] = [dict(t) for t in {tuple(r.items()) for r in refs}]
    return folded


def event_catalogue(
    docs: dict[str, dict[str, Any]], handlers: dict[str, list[Wired]] | None = None
) -> str:
    """docs/events.md: one row per subject, who publishes, who subscribes and the function
    that handles it (`module:function`, from each service's wiring table)."""
    from gpufleet_auth.permissions import who_may
    from gpufleet_bus.streams import stream_for
    from gpufleet_contracts import Message, subjects

    rows: dict[str, dict[str, Any]] = {}
    for service, doc in docs.items():
        for op in doc.get("operations", {}).values():
            channel_ref = op["channel"]["$ref"].rsplit("/", 1)[-1]
            channel = doc["channels"][channel_ref]
            address = _normalise(channel["address"])
            row = rows.setdefault(address, {"send": set(), "receive": set(), "messages": set()})
            row["send" if op["action"] == "send" else "receive"].add(service)
            for m in channel.get("messages", {}).values():
                ref = m.get("$ref", "")
                row["messages"].add(ref.rsplit("/", 1)[-1])
    for service, table in (handlers or {}).items():
        for wired in table:
            if wired.kind == "publish":
                continue
            address = _normalise(subjects.wildcard(wired.subject))
            row = rows.setdefault(address, {"send": set(), "receive": set(), "messages": set()})
            row["receive"].add(service)
            row.setdefault("handlers", set()).add(f"`{wired.handler}`")
    types = {cls.SUBJECT: cls.TYPE for cls in _all_messages(Message) if cls.SUBJECT and cls.TYPE}
    lines = [
        "# Event catalogue",
        "",
        "Generated by `just docs` from the services' FastStream apps; do not edit by hand.",
        "The subject scheme is documented in `libs/contracts/src/gpufleet_contracts/subjects.py`;",
        "each service's full AsyncAPI 3.0 document (payload schemas included) is in",
        "[`asyncapi/`](asyncapi/).",
        "",
        f"Streams: `{subjects.STREAM_EVENTS}` (`{subjects.EVENTS}.*.*` and four tokens or "
        f"more), `{subjects.STREAM_REPORTS}` (`{subjects.EVENTS}.*.*.*`: what a node reports, "
        "until a service reads it), "
        f"`{subjects.STREAM_COMMANDS}` (`{subjects.COMMANDS}.>`), "
        f"`{subjects.node_logs_stream('<minion_id>')}` (`{subjects.LOGS}.<minion_id>.>`: one "
        f"per node), `{subjects.STREAM_DLQ}` "
        f"(`{subjects.DLQ}.>`); their limits: "
        "[`reliability.md`](reliability.md#what-a-node-or-an-account-can-store). "
        f"Request/reply (`{subjects.RPC}.<service>.<verb>.<account>`, "
        f"`{subjects.ADMIN}.*`, `{subjects.ENROLL}.*`, `{subjects.NODES}.*`) and heartbeats "
        f"(`{subjects.HEARTBEATS}.*`) are core NATS.",
        "",
        "The last two columns are what the NATS server lets through "
        "([`permissions.md`](permissions.md)): who may publish on the subject, and who may "
        "read it (subscribe, or for a stream's subject consume that stream). Everything else "
        "is refused before any gpufleet code runs.",
        "",
        "| subject | CloudEvents type | published by | handled by | handler | may publish "
        "| may read |",
        "|---|---|---|---|---|---|---|",
    ]
    for address in sorted(rows):
        row = rows[address]
        may_pub, may_read = who_may(address, stream_for(_concrete(address)))
        lines.append(
            f"| `{address}` | {('`' + types[address] + '`') if address in types else ''} | "
            f"{', '.join(sorted(row['send'])) or '(clients)'} | "
            f"{', '.join(sorted(row['receive'])) or '(other systems)'} | "
            f"{'<br>'.join(sorted(row.get('handlers', ()))) or ''} | "
            f"{', '.join(may_pub) or '(nobody)'} | {', '.join(may_read) or '(nobody)'} |"
        )
    return "\n".join(lines) + "\n"


def _concrete(address: str) -> str:
    return ".".join("x" if "{" in t or t == "*" else t for t in address.split("."))


def _normalise(address: str) -> str:
    """One row per subject: a subscription's wildcard and a message's `{key}` name the same
    subject (`...worker.started.*` is `...worker.started.{minion_id}`; an account request's
    last token is `{account}`)."""
    import re

    from gpufleet_contracts import Message, subjects

    address = address.replace("MINION_ID", "{minion_id}")
    if address == f"{_hb()}.*":
        return f"{_hb()}.{{minion_id}}"
    for cls in _all_messages(Message):
        if "{" in cls.SUBJECT and address == re.sub(r"\{[^}]*\}", "*", cls.SUBJECT):
            return str(cls.SUBJECT)
    if address.startswith(subjects.RPC + ".") and address.endswith(".*"):
        return address[:-1] + "{account}"
    return address


def _hb() -> str:
    from gpufleet_contracts import subjects

    return subjects.HEARTBEATS


def _all_messages(base: type[Any]) -> list[type[Any]]:
    out: list[type[Any]] = []
    subclasses: list[type[Any]] = base.__subclasses__()
    for sub in subclasses:
        out.append(sub)
        out.extend(_all_messages(sub))
    return out


def render(*, check: bool = False) -> dict[Path, str]:
    """Every generated file and its text. For `check`, the rule index keeps the titles it
    has (they are PRODUCT.md's, which is not part of the repository): only its citations
    are checked."""
    built = {name: build() for name, build in _services().items()}
    docs = {name: asyncapi(service.app) for name, service in built.items()}
    handlers = {name: service.runtime.table for name, service in built.items()}
    files = {
        DOCS / "asyncapi" / f"{name}.json": json.dumps(doc, indent=2, sort_keys=True) + "\n"
        for name, doc in docs.items()
    }
    files[DOCS / "events.md"] = event_catalogue(docs, handlers)
    from gpufleet_auth.permissions import markdown

    files[DOCS / "permissions.md"] = markdown()
    index = DOCS / "rules.md"
    previous = index.read_text() if index.exists() else None
    files[index] = rules.render(ROOT, previous, read_product=not check)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if docs/ is stale")
    args = parser.parse_args(argv)
    files = render(check=args.check)
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run `just docs`)", file=sys.stderr)
        return 1 if stale else 0
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
