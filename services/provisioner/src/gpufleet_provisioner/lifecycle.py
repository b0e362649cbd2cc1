"""GCP audit-log entries -> CloudInstanceEvent, and what an event does to a node. Pure.

The sink delivers at least once and in no guaranteed order: an operation's `last` entry may
come before its `first`, an entry may come twice. Each event has a rank in an instance's life
(insert < stop/preempted < delete); an event of a lower rank than what was already applied is
recorded but changes nothing, and the same (action, phase) is applied once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufleet_contracts.nodes import CloudInstanceEvent

ACTIONS = {
    "compute.instances.insert": "insert",
    "compute.instances.delete": "delete",
    "compute.instances.stop": "stop",
    "compute.instances.preempted": "preempted",
}

RANK = {
    ("insert", "first"): 1,
    ("insert", "last"): 2,
    ("insert", "single"): 2,
    ("stop", "first"): 3,
    ("stop", "last"): 4,
    ("stop", "single"): 4,
    ("preempted", "first"): 4,
    ("preempted", "last"): 4,
    ("preempted", "single"): 4,
    ("delete", "first"): 5,
    ("delete", "last"): 6,
    ("delete", "single"): 6,
}


def action_of(method: str) -> str:
    for key, action in ACTIONS.items():
        if method.endswith(key):
            return action
    return "other"


def parse_entry(data: bytes, message_id: str) -> CloudInstanceEvent | None:
    """A LogEntry (JSON, as a Logging sink publishes it) as an event; None if not an instance's."""
    try:
        entry: dict[str, Any] = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(entry, dict):
        return None
    resource = entry.get("resource") or {}
    payload = entry.get("protoPayload") or {}
    if resource.get("type") != "gce_instance" or not isinstance(payload, dict):
        return None
    labels = resource.get("labels") or {}
    name = str(payload.get("resourceName") or "").rsplit("/", 1)[-1]
    if not name:
        return None
    op = entry.get("operation") or {}
    first, last = bool(op.get("first")), bool(op.get("last"))
    phase = "single" if first == last else ("first" if first else "last")
    status = payload.get("status") or {}
    error = status.get("message") if status.get("code") else None
    method = str(payload.get("methodName") or "")
    return CloudInstanceEvent(
        provider="gcp",
        project_id=str(labels.get("project_id") or ""),
        zone=str(labels.get("zone") or ""),
        instance=name,
        instance_id=str(labels["instance_id"]) if labels.get("instance_id") else None,
        action=action_of(method),
        method=method,
        phase=phase,
        log_insert_id=entry.get("insertId"),
        timestamp=datetime.fromisoformat(str(entry.get("timestamp")).replace("Z", "+00:00")),
        pubsub_message_id=message_id,
        error=error,
    )


@dataclass(frozen=True)
class Transition:
    apply: bool  # False: duplicate or stale (recorded only)
    cloud_state: str | None = None  # the instance's new state, as the provisioner tracks it
    node_state: str | None = None  # the node's new state, if it changes
    reason: str | None = None


def transition(
    evt: CloudInstanceEvent, rank_now: int, applied: set[str], node_state: str
) -> Transition:
    key = f"{evt.action}:{evt.phase}"
    rank = RANK.get((evt.action, evt.phase), 0)
    if key in applied or rank == 0 or rank < rank_now:
        return Transition(apply=False)
    a, p = evt.action, evt.phase
    if a == "insert":
        if evt.error:
            return Transition(True, "failed", reason=f"insert failed: {evt.error}")
        return Transition(True, "provisioning" if p == "first" else "running")
    if a == "preempted":
        lost = "lost" if node_state in {"active", "maintenance"} else None
        return Transition(True, "preempted", lost, "preempted by Google Cloud")
    if a == "stop":
        lost = "lost" if node_state in {"active", "maintenance"} else None
        return Transition(True, "terminated", lost, "instance stopped")
    if a == "delete":
        if p == "first":
            lost = "lost" if node_state == "active" else None
            return Transition(True, "deleting", lost, "instance being deleted")
        return Transition(True, "deleted", "removed", "instance deleted")
    return Transition(apply=False)
