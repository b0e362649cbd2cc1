"""The provisioner's Prometheus series (docs/metrics.md): each node's liveness and the nodes
by state, read from the stored nodes at each scrape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from gpufleet_contracts.nodes import NodeState
from gpufleet_store import Doc, now_ms
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from .liveness import Liveness

NODE_LABELS = ("node", "region", "owner")
FIELDS = ("minion_id", "region", "owner", "state", "last_seen_ms", "heartbeat_s")


def node_families(
    nodes: Sequence[Doc], now: int, lost_after_ms: Callable[[Doc], int]
) -> list[Metric]:
    """`gpufleet_node_up` is 1 while a node's last heartbeat is more recent than the silence
    that makes it lost, and it is not lost; a removed node has no series."""
    up = GaugeMetricFamily(
        "gpufleet_node_up",
        "1: the node's heartbeats are fresh; 0: lost, or silent past its lost limit.",
        labels=NODE_LABELS,
    )
    seen = GaugeMetricFamily(
        "gpufleet_node_last_heartbeat_timestamp_seconds",
        "When the provisioner last stored a heartbeat of the node (Unix time).",
        labels=NODE_LABELS,
    )
    by_state: Counter[tuple[str, str]] = Counter()
    for node in nodes:
        state = str(node.get("state", ""))
        region = str(node.get("region", ""))
        by_state[(region, state)] += 1
        if state == NodeState.removed.value:
            continue
        labels = [str(node["minion_id"]), region, str(node.get("owner", ""))]
        last = node.get("last_seen_ms")
        fresh = (
            last is not None
            and state != NodeState.lost.value
            and now - int(last) <= lost_after_ms(node)
        )
        up.add_metric(labels, 1 if fresh else 0)
        if last is not None:
            seen.add_metric(labels, int(last) / 1000)
    counts = GaugeMetricFamily("gpufleet_nodes", "Nodes by state.", labels=("region", "state"))
    for (region, state), n in sorted(by_state.items()):
        counts.add_metric([region, state], n)
    return [up, seen, counts]


class ProvisionerMetrics:
    def __init__(self, liveness: Liveness) -> None:
        self.liveness = liveness

    async def collect(self) -> list[Metric]:
        records = self.liveness.records
        nodes = await records.db.nodes.find({"kind": "compute"}, dict.fromkeys(FIELDS, 1)).to_list(
            None
        )
        return node_families(nodes, now_ms(records.clock()), self.liveness.lost_after_ms)
