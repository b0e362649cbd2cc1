"""gpufleet's metrics record what the dashboard charts, under the names it expects."""

from gpufleet_telemetry.instruments import Metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader


def collect(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, str], float]]]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[f"{m.name} [{m.unit}]"] = [
                    ({k: str(v) for k, v in (p.attributes or {}).items()}, p.value)
                    for p in m.data.data_points
                ]
    return out


def test_instruments_record_with_the_dashboards_names_and_units() -> None:
    reader = InMemoryMetricReader()
    m = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    m.jobs_submitted.add(3)
    m.jobs_placed.add(2)
    m.worker_runs.add(1, {"state": "finished"})
    m.ledger_entries.add(2, {"kind": "usage_fee"})
    m.set_queue_depth(7)
    m.set_gpu_utilization("node-a", 1, 85)
    m.set_gpu_utilization("node-b", 0, 40)
    m.set_gpu_utilization("node-b", 0, None)  # no reading: the series goes away
    got = collect(reader)
    assert got["gpufleet.jobs.submitted [{job}]"] == [({}, 3)]
    assert got["gpufleet.jobs.placed [{worker}]"] == [({}, 2)]
    assert got["gpufleet.worker.runs [{run}]"] == [({"state": "finished"}, 1)]
    assert got["gpufleet.ledger.entries [{entry}]"] == [({"kind": "usage_fee"}, 2)]
    assert got["gpufleet.queue.depth [{worker}]"] == [({}, 7)]
    assert got["gpufleet.node.gpu_utilization [%]"] == [({"node": "node-a", "gpu": "1"}, 85)]
