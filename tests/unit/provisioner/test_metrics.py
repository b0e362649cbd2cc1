"""The provisioner's series: a node is up while its heartbeat is fresh and it is not lost."""

from __future__ import annotations

from gpufleet_provisioner.metrics import node_families

NOW = 1_000_000


def test_node_up_and_nodes_by_state() -> None:
    nodes = [
        {
            "minion_id": "a",
            "region": "eu",
            "owner": "o",
            "state": "active",
            "last_seen_ms": NOW - 5_000,
        },
        {
            "minion_id": "b",
            "region": "eu",
            "owner": "o",
            "state": "active",
            "last_seen_ms": NOW - 61_000,
        },
        {
            "minion_id": "c",
            "region": "eu",
            "owner": "p",
            "state": "lost",
            "last_seen_ms": NOW - 1_000,
        },
        {"minion_id": "d", "region": "us", "owner": "p", "state": "provisioning"},
        {"minion_id": "e", "region": "us", "owner": "p", "state": "removed", "last_seen_ms": NOW},
    ]
    up, seen, counts = node_families(nodes, NOW, lambda node: 60_000)
    assert {s.labels["node"]: s.value for s in up.samples} == {"a": 1, "b": 0, "c": 0, "d": 0}
    assert {s.labels["node"]: s.value for s in seen.samples} == {
        "a": (NOW - 5_000) / 1000,
        "b": (NOW - 61_000) / 1000,
        "c": (NOW - 1_000) / 1000,
    }
    assert {(s.labels["region"], s.labels["state"]): s.value for s in counts.samples} == {
        ("eu", "active"): 2,
        ("eu", "lost"): 1,
        ("us", "provisioning"): 1,
        ("us", "removed"): 1,
    }
