"""The scheduler's Prometheus series (docs/metrics.md): the queue and the running jobs by
region and account, and the placements made, from the leader's memory at each scrape.

Only the leading instance has the open jobs in memory (state.py), so only it exports the
queue: the other instances' scrapes hold no queue samples, and a sum over instances counts
each job once. A job's account is its project's owner (who pays, R-BILL-1); a queued job's
region is the one it pinned ("" for any region), a running job's the region of the node its
first placed worker runs on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from gpufleet_contracts.jobs import JobState
from gpufleet_store import Doc, now_ms
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from .jobrequest import JobRequest
from .scheduler import Scheduler

LABELS = ("region", "account")


def _running_region(job: Doc) -> str:
    for w in job.get("workers") or []:
        if w.get("region"):
            return str(w["region"])
    return ""


def queue_families(
    jobs: Iterable[Doc], requests: Mapping[str, JobRequest], now: int
) -> list[Metric]:
    queued: Counter[tuple[str, str]] = Counter()
    oldest: dict[tuple[str, str], int] = {}
    running: Counter[tuple[str, str]] = Counter()
    for job in jobs:
        account = str(job.get("owner", ""))
        if job["state"] == JobState.queued.value:
            req = requests.get(job["_id"])
            key = ((req.region if req is not None else None) or "", account)
            queued[key] += 1
            since = int(job.get("queued_ms") or now)
            oldest[key] = min(oldest.get(key, since), since)
        elif job["state"] == JobState.running.value:
            running[(_running_region(job), account)] += 1
    depth = GaugeMetricFamily("gpufleet_queue_jobs", "Jobs queued.", labels=LABELS)
    wait = GaugeMetricFamily(
        "gpufleet_queue_oldest_wait_seconds",
        "How long the oldest queued job has waited, s.",
        labels=LABELS,
    )
    for key, n in sorted(queued.items()):
        depth.add_metric(list(key), n)
        wait.add_metric(list(key), max(0, now - oldest[key]) / 1000)
    run = GaugeMetricFamily("gpufleet_jobs_running", "Jobs running.", labels=LABELS)
    for key, n in sorted(running.items()):
        run.add_metric(list(key), n)
    return [depth, wait, run]


def placement_family(placed: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(
        "gpufleet_placements",
        "Workers placed on a node by this instance since it started, by the node's region.",
        labels=("region",),
    )
    for region, n in sorted(placed.items()):
        family.add_metric([region], n)
    return family


class SchedulerMetrics:
    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    async def collect(self) -> list[Metric]:
        st = self.sched.state
        if st.loaded:
            families = queue_families(st.jobs.values(), st.requests, now_ms(st.clock()))
        else:
            families = queue_families([], {}, 0)
        return [*families, placement_family(self.sched.passes.placed_by_region)]
