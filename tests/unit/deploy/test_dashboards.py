"""Grafana's dashboards chart only series that exist: each gpufleet name an expression uses
is served by some /metrics (docs/metrics.md, which lists every one of them) or made by the
collector from an OpenTelemetry instrument; and Prometheus's scrape job is the same in
compose and under `just up`."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime

import yaml
from gpufleet_billing.metrics import LedgerTotals, ledger_families
from gpufleet_contracts.nodes import GpuInfo, GpuSample, XidEvent
from gpufleet_devstack.prometheus import gpufleet_scrape_job
from gpufleet_node_agent.host.metrics import (
    Holder,
    NodeLabels,
    XidTally,
    gpu_families,
    host_families,
    transfer_families,
)
from gpufleet_node_agent.host.telemetry import HostSample
from gpufleet_node_agent.staging.tally import Counted, Direction, TransferTally
from gpufleet_provisioner.metrics import node_families
from gpufleet_scheduler.metrics import placement_family, queue_families
from gpufleet_telemetry.exposition import render
from gpufleet_telemetry.instruments import Metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from .files import ROOT, environment, load_compose

DASHBOARDS = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DOCS = ROOT / "docs" / "metrics.md"
NAME = re.compile(r"\bgpufleet_[a-z0-9_]+\b")


def families_of_every_source() -> list[Metric]:
    """Each source's families, built from data that fills every series."""
    node = NodeLabels("m", "r", "o")
    gpu = GpuSample(
        index=0,
        **dict.fromkeys(["utilization_pct", "memory_used_mb", "temperature_c", "retired_pages"], 1),
        **dict.fromkeys(
            [
                "ecc_volatile_corrected",
                "ecc_volatile_uncorrected",
                "ecc_aggregate_corrected",
                "ecc_aggregate_uncorrected",
                "remapped_rows_corrected",
                "remapped_rows_uncorrected",
            ],
            1,
        ),
        power_w=1.0,
        remapped_rows_pending=False,
        remapped_rows_failed=False,
        xid_events=[XidEvent(xid=79, at=datetime(2026, 1, 1, tzinfo=UTC))],
    )
    info = GpuInfo(index=0, uuid="GPU-0", model=None, nvml_name="x", memory_mb=1)
    xids = XidTally()
    xids.add([gpu])
    host = HostSample(1.0, 1, 1.0, 1.0, 1, 1, 1, 1, 1)
    jobs = [
        {"_id": "a", "state": "queued", "owner": "o", "queued_ms": 0},
        {"_id": "b", "state": "running", "owner": "o", "workers": []},
    ]
    transfers = TransferTally()
    for direction in Direction:
        transfers.add(Counted(direction, "j", "o", "s3"), 1)
    totals = LedgerTotals()
    totals.spent["o"] = totals.earned[("o", "m", "r")] = totals.node_cost[("m", "r", "o")] = 1
    return [
        *gpu_families(node, [info], [gpu], {0: [Holder("j", "o")]}, xids),
        *host_families(node, host),
        *transfer_families(node, transfers),
        *node_families([{"minion_id": "m", "state": "active", "last_seen_ms": 0}], 0, lambda n: 1),
        *queue_families(jobs, {}, 0),
        placement_family({"r": 1}),
        *ledger_families(totals),
        *text_string_to_metric_families(asyncio.run(render([])).decode()),
    ]


def served() -> set[str]:
    """The names of every sample /metrics serves (a counter's with `_total`)."""
    return {s.name for f in families_of_every_source() for s in f.samples}


def from_instruments() -> set[str]:
    """The names the collector's Prometheus exporter gives gpufleet's OTel instruments
    (deploy/otel/collector.yaml: dots to underscores, a unit's suffix, `_total`)."""
    reader = InMemoryMetricReader()
    m = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    for counter in (m.jobs_submitted, m.jobs_placed, m.worker_runs, m.ledger_entries):
        counter.add(1)
    m.replies_refused.add(1)
    m.set_gpu_utilization("n", 0, 1)
    data = reader.get_metrics_data()
    assert data is not None
    names = set()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = metric.name.replace(".", "_")
                suffix = {"%": "percent", "s": "seconds", "By": "bytes"}.get(metric.unit or "")
                if suffix and not name.endswith(f"_{suffix}"):
                    name += f"_{suffix}"
                if isinstance(metric.data, Sum) and metric.data.is_monotonic:
                    name += "_total"
                names.add(name)
    return names


def dashboard_names() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        panels = json.loads(path.read_text())["panels"]
        for p in panels:
            for t in p.get("targets", []):
                for name in NAME.findall(t.get("expr", "")):
                    found.setdefault(name, set()).add(f"{path.name}: {p['title']}")
    return found


def test_dashboards_chart_only_series_that_exist() -> None:
    known = served() | from_instruments()
    used = dashboard_names()
    assert used, "no gpufleet series on the dashboards"
    missing = {name: where for name, where in used.items() if name not in known}
    assert not missing, f"dashboards chart series nothing serves: {missing}"
    # the node agent's, the scheduler's and billing's series are charted
    assert {"gpufleet_gpu_utilization_percent", "gpufleet_queue_jobs"} <= set(used)


def test_docs_list_every_served_series() -> None:
    """The first column of docs/metrics.md's tables: each series by its exposed name."""
    documented = set(re.findall(r"^\| `(gpufleet_[a-z0-9_]+)`", DOCS.read_text(), re.MULTILINE))
    exposed = {
        f"{f.name}_total" if f.type == "counter" else f.name for f in families_of_every_source()
    }
    assert exposed and documented == exposed, (exposed - documented, documented - exposed)


def test_compose_scrapes_every_metrics_port_as_just_up_does() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpufleet"]
    targets = job["static_configs"][0]["targets"]
    ours = gpufleet_scrape_job(targets, 5.0)
    for key in ("honor_labels", "metric_relabel_configs", "static_configs"):
        assert job[key] == ours[key], key
    env = {"GPUFLEET_NATS_JETSTREAM_KEY": "k", "GPUFLEET_SECRET_KEY": "k"}
    services = load_compose(env=env)["services"]
    port = environment(services["scheduler"])["GPUFLEET_METRICS_PORT"]
    exposing = sorted(
        name
        for name, svc in services.items()
        if "GPUFLEET_METRICS_PORT" in environment(svc)
        and name != "bootstrap"  # a one-shot: nothing to scrape
    )
    assert sorted(t.split(":")[0] for t in targets) == exposing
    assert all(t.endswith(f":{port}") for t in targets)
    assert "nodes" in services["prometheus"]["networks"]  # the node agent's network
