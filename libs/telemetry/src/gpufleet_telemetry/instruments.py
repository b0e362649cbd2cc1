"""gpufleet's own metrics: the series the Grafana dashboard charts.

Names and units are chosen so that the OpenTelemetry collector's Prometheus exporter produces
the dashboard's series: counters get `_total`, unit `%` becomes `_percent`, and units in braces
(`{job}`) add no suffix. `gpufleet.jobs.submitted` -> `gpufleet_jobs_submitted_total`.

Instruments are created from the global meter: before `configure()` sets the provider they are
proxies, and they record once it is set, so modules may import `METRICS` at any time.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation


class Metrics:
    def __init__(self, meter: Meter) -> None:
        self.jobs_submitted = meter.create_counter(
            "gpufleet.jobs.submitted", unit="{job}", description="Jobs accepted by the scheduler."
        )
        self.jobs_placed = meter.create_counter(
            "gpufleet.jobs.placed", unit="{worker}", description="Workers placed on a node."
        )
        self.worker_runs = meter.create_counter(
            "gpufleet.worker.runs", unit="{run}", description="Worker runs ended, by state."
        )
        self.ledger_entries = meter.create_counter(
            "gpufleet.ledger.entries", unit="{entry}", description="Ledger entries, by kind."
        )
        self.replies_refused = meter.create_counter(
            "gpufleet.replies.refused",
            unit="{request}",
            description="Requests left unserved: their reply was aimed outside the requester's "
            "inboxes, by service.",
        )
        self._queue_depth = 0
        self._gpu_utilization: dict[tuple[str, int], int] = {}
        meter.create_observable_gauge(
            "gpufleet.queue.depth",
            [self._observe_queue],
            unit="{worker}",
            description="Workers waiting for GPUs after the last placement pass.",
        )
        meter.create_observable_gauge(
            "gpufleet.node.gpu_utilization",
            [self._observe_gpus],
            unit="%",
            description="GPU utilisation reported by each node's last heartbeat.",
        )

    def set_queue_depth(self, waiting: int) -> None:
        self._queue_depth = waiting

    def set_gpu_utilization(self, node: str, gpu: int, percent: int | None) -> None:
        if percent is None:
            self._gpu_utilization.pop((node, gpu), None)
        else:
            self._gpu_utilization[(node, gpu)] = percent

    def _observe_queue(self, _: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._queue_depth)

    def _observe_gpus(self, _: CallbackOptions) -> Iterable[Observation]:
        for (node, gpu), percent in list(self._gpu_utilization.items()):
            yield Observation(percent, {"node": node, "gpu": str(gpu)})


METRICS = Metrics(metrics.get_meter("gpufleet"))
