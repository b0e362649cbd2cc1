"""Who may do what with the streams that bound nodes (permissions.py): the provisioner makes
and deletes nodes' log streams and no shared one; only the scheduler states the reports it
took; a node reports on its own subjects only."""

from __future__ import annotations

import pytest
from gpufleet_auth import permissions
from gpufleet_contracts import subjects

INBOX = "_INBOX.UKEY"
SHARED = (
    subjects.STREAM_EVENTS,
    subjects.STREAM_COMMANDS,
    subjects.STREAM_REPORTS,
    subjects.STREAM_DLQ,
)


def test_the_provisioner_makes_and_deletes_nodes_log_streams_and_no_shared_one() -> None:
    prov = permissions.for_service("provisioner", INBOX)
    for op in ("CREATE", "UPDATE", "INFO", "DELETE"):
        assert prov.may_publish(f"$JS.API.STREAM.{op}.{subjects.node_logs_stream('m1')}")
    for stream in SHARED:
        assert not prov.may_publish(f"$JS.API.STREAM.DELETE.{stream}")
        assert not prov.may_publish(f"$JS.API.STREAM.UPDATE.{stream}")
        assert not prov.may_publish(f"$JS.API.STREAM.PURGE.{stream}")
        assert prov.may_publish(f"$JS.API.STREAM.CREATE.{stream}")  # declared at start-up
    assert prov.may_publish(f"$JS.API.STREAM.DELETE.{subjects.STREAM_LOGS}")  # retired
    assert not prov.may_publish(f"$JS.API.STREAM.MSG.DELETE.{subjects.node_logs_stream('m1')}")


@pytest.mark.parametrize("service", sorted(set(permissions.SERVICES) - {"provisioner"}))
def test_no_other_service_deletes_or_updates_a_stream(service: str) -> None:
    grant = permissions.for_service(service, INBOX)
    for stream in (*SHARED, subjects.node_logs_stream("m1")):
        assert not grant.may_publish(f"$JS.API.STREAM.DELETE.{stream}")
        assert not grant.may_publish(f"$JS.API.STREAM.UPDATE.{stream}")


def test_only_the_scheduler_states_kept_reports_and_reads_nodes_log_streams() -> None:
    kept = subjects.kept("finished", "m1")
    assert permissions.for_service("scheduler", INBOX).may_publish(kept)
    for service in set(permissions.SERVICES) - {"scheduler"}:
        assert not permissions.for_service(service, INBOX).may_publish(kept)
    node = permissions.for_node("m1", INBOX)
    assert not node.may_publish(kept)
    assert node.may_publish(f"{subjects.EVENTS}.worker.finished.m1")
    assert not node.may_publish(f"{subjects.EVENTS}.worker.finished.m2")
    logs = subjects.node_logs_stream("m1")
    scheduler = permissions.for_service("scheduler", INBOX)
    assert scheduler.may_publish(f"$JS.API.CONSUMER.CREATE.{logs}")
    assert scheduler.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{subjects.STREAM_REPORTS}.s")
    assert not node.may_publish(f"$JS.API.CONSUMER.CREATE.{logs}")
