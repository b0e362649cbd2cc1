"""Audit-log entries -> CloudInstanceEvent, and the transitions they cause (R-NODE-5)."""

from __future__ import annotations

import json
from typing import Any

from gpufleet_provisioner.lifecycle import RANK, parse_entry, transition


def entry(method: str, *, first: bool = False, last: bool = False, **kw: Any) -> bytes:
    doc: dict[str, Any] = {
        "insertId": "x1",
        "logName": "projects/acme/logs/cloudaudit.googleapis.com%2Factivity",
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "methodName": method,
            "resourceName": "projects/acme/zones/us-central1-a/instances/gf-1",
        },
        "resource": {
            "type": "gce_instance",
            "labels": {"instance_id": "42", "project_id": "acme", "zone": "us-central1-a"},
        },
        "timestamp": "2026-11-22T01:02:03.123456Z",
        "operation": {"id": "op-1", "first": first, "last": last},
    }
    doc.update(kw)
    return json.dumps(doc).encode()


def test_parse_insert_first_and_last() -> None:
    e = parse_entry(entry("v1.compute.instances.insert", first=True), "m1")
    assert e is not None
    assert (e.instance, e.instance_id, e.zone, e.project_id) == (
        "gf-1",
        "42",
        "us-central1-a",
        "acme",
    )
    assert (e.action, e.phase, e.pubsub_message_id) == ("insert", "first", "m1")
    last = parse_entry(entry("v1.compute.instances.insert", last=True), "m2")
    assert last is not None and last.phase == "last" and last.error is None


def test_parse_preemption_and_errors() -> None:
    e = parse_entry(entry("compute.instances.preempted", first=True, last=True), "m")
    assert e is not None and (e.action, e.phase) == ("preempted", "single")
    failed = entry(
        "v1.compute.instances.insert",
        last=True,
        protoPayload={
            "methodName": "v1.compute.instances.insert",
            "resourceName": "projects/acme/zones/us-central1-a/instances/gf-1",
            "status": {"code": 14, "message": "zone exhausted"},
        },
    )
    e = parse_entry(failed, "m")
    assert e is not None and e.error == "zone exhausted"


def test_not_an_instance_entry_is_none() -> None:
    assert parse_entry(b"{not json", "m") is None
    assert parse_entry(entry("x", resource={"type": "gce_disk", "labels": {}}), "m") is None


def ev(method: str, phase: str) -> Any:
    first, last = phase in {"first", "single"}, phase in {"last", "single"}
    e = parse_entry(entry(method, first=first, last=last), "m")
    assert e is not None
    return e


INSERT_FIRST = ev("v1.compute.instances.insert", "first")
INSERT_LAST = ev("v1.compute.instances.insert", "last")
DELETE_FIRST = ev("v1.compute.instances.delete", "first")
DELETE_LAST = ev("v1.compute.instances.delete", "last")
PREEMPTED = ev("compute.instances.preempted", "single")


def test_in_order_lifecycle() -> None:
    t = transition(INSERT_FIRST, 0, set(), "provisioning")
    assert (t.apply, t.cloud_state, t.node_state) == (True, "provisioning", None)
    t = transition(INSERT_LAST, RANK[("insert", "first")], {"insert:first"}, "provisioning")
    assert (t.apply, t.cloud_state) == (True, "running")
    t = transition(DELETE_FIRST, 2, {"insert:first", "insert:last"}, "maintenance")
    assert (t.apply, t.cloud_state, t.node_state) == (True, "deleting", None)
    t = transition(DELETE_LAST, 5, {"delete:first"}, "maintenance")
    assert (t.apply, t.cloud_state, t.node_state) == (True, "deleted", "removed")


def test_duplicates_are_applied_once() -> None:
    assert not transition(INSERT_LAST, 2, {"insert:first", "insert:last"}, "active").apply


def test_out_of_order_first_after_last_changes_nothing() -> None:
    t = transition(INSERT_LAST, 0, set(), "provisioning")
    assert t.apply and t.cloud_state == "running"
    assert not transition(INSERT_FIRST, RANK[("insert", "last")], {"insert:last"}, "active").apply
    # a late insert entry never revives a deleted instance
    assert not transition(INSERT_LAST, RANK[("delete", "last")], {"delete:last"}, "removed").apply


def test_preemption_loses_an_active_node() -> None:
    t = transition(PREEMPTED, 2, {"insert:last"}, "active")
    assert (t.cloud_state, t.node_state) == ("preempted", "lost")
    assert "preempted" in (t.reason or "")


def test_delete_by_someone_else_loses_an_active_node() -> None:
    t = transition(DELETE_FIRST, 2, {"insert:last"}, "active")
    assert t.node_state == "lost"
