"""Alerts over a real Prometheus: it scrapes a real `/metrics` (gpufleet_telemetry's server,
the node agent's GPU series as a test sets them, or a real node agent's simulated GPUs), the
provisioner evaluates the rules against it, and AlertFired / AlertResolved arrive on the bus;
an XID fires the built-in rule (injected through the agent's simulated-telemetry.json) and
puts its node into maintenance. Accounts see only their own rules and alerts."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from gpufleet_contracts import subjects
from gpufleet_devstack import EmbeddedMongo, NatsServer, free_port, wait_for_async
from gpufleet_devstack.prometheus import find_prometheus, query, running_prometheus
from gpufleet_telemetry.exposition import MetricsServer, MetricsSettings, Source
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..node_agent.test_node_agent import running_agent
from .test_nodes import Bus, good_hw, node, provisioner, registration

pytestmark = pytest.mark.skipif(find_prometheus() is None, reason="prometheus is not installed")

LABELS = ("node", "region", "owner", "gpu", "gpu_uuid", "job", "account")


class Gpu:
    """One GPU's series as the node agent exposes them, set by the test."""

    def __init__(self, node: str, account: str) -> None:
        self.labels = [node, "lab", account, "0", f"GPU-{node}", "job-1", account]
        self.temperature = 40.0
        self.xids = 0
        self.last_xid = 0
        self.prometheus = ""  # the URL of the Prometheus scraping it
        self.settings: dict[str, Any] = {}  # the provisioner's that evaluates its rules

    async def collect(self) -> list[Metric]:
        temp = GaugeMetricFamily("gpufleet_gpu_temperature_celsius", "C", labels=LABELS)
        temp.add_metric(self.labels, self.temperature)
        last = GaugeMetricFamily("gpufleet_gpu_last_xid", "last XID", labels=LABELS)
        last.add_metric(self.labels, self.last_xid)
        total = CounterMetricFamily("gpufleet_gpu_xid_errors", "XIDs", labels=LABELS)
        total.add_metric(self.labels, self.xids)
        return [temp, last, total]


class Alerts:
    """The alert events on the bus, as an operator sees them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def on(self, msg: Any) -> None:
        self.events.append((msg.subject.rsplit(".", 1)[-1], json.loads(msg.data)["alert"]))

    def of(self, rule: str, kind: str) -> list[dict[str, Any]]:
        return [a for k, a in self.events if k == kind and a["rule_name"] == rule]


@asynccontextmanager
async def fleet(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    tmp_path: Path,
    **extra: Any,
) -> AsyncIterator[tuple[Bus, Gpu, Alerts]]:
    minion = f"g-{uuid.uuid4().hex[:6]}"
    holder: list[Gpu] = []

    async def collect() -> list[Metric]:
        return await holder[0].collect() if holder else []

    metrics = MetricsServer([Source("gpu", collect)], "127.0.0.1", 0)
    port = await metrics.start()
    try:
        with running_prometheus([f"127.0.0.1:{port}"], tmp_path, scrape_interval_s=0.5) as prom:
            settings = {
                "prometheus_url": prom.url,
                "alert_eval_s": 0.3,
                "auto_activate_nodes": True,
                "waive_hardware_rules": True,
                "node_lost_min_s": 600.0,
                **extra,
            }
            async with provisioner(nats_server, mongo_server, db_prefix, **settings) as bus:
                exporter = Gpu(minion, bus.account)
                exporter.prometheus, exporter.settings = prom.url, settings
                holder.append(exporter)
                alerts = Alerts()
                await bus.nc.subscribe(subjects.event("alert", "*"), cb=alerts.on)
                yield bus, exporter, alerts
    finally:
        await metrics.stop()


async def test_a_rule_fires_after_its_for_and_resolves_as_events(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix, tmp_path) as (bus, gpu, alerts):
        rule = await bus.ask(
            "add_alert_rule",
            {
                "name": "hot",
                "series": "gpufleet_gpu_temperature_celsius",
                "comparison": ">",
                "threshold": 85,
                "for_s": 1.0,
                "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }} C"},
            },
        )
        assert rule["query"] == (
            f'gpufleet_gpu_temperature_celsius{{account="{bus.account}"}} > 85.0'
        ), rule
        gpu.temperature = 92.0
        await wait_for_async(lambda: bool(alerts.of("hot", "fired")), timeout=30)
        fired = alerts.of("hot", "fired")[0]
        assert fired["state"] == "firing" and fired["account"] == bus.account
        assert fired["labels"]["node"] == gpu.labels[0] and fired["labels"]["alertname"] == "hot"
        assert fired["annotations"]["summary"] == "GPU 0 at 92 C"
        held = _seconds(fired["fired_at"]) - _seconds(fired["started_at"])
        assert held >= 1.0, fired  # pending for its `for` first
        listed = await bus.ask("list_alerts", {"state": "firing"})
        assert [a["id"] for a in listed["alerts"]] == [fired["id"]]

        # a second provisioner on the same database (a restart, or two at once): each
        # transition is still stated once
        async with provisioner(nats_server, mongo_server, db_prefix, **gpu.settings):
            await asyncio.sleep(1.0)
            assert len(alerts.of("hot", "fired")) == 1
            gpu.temperature = 40.0
            await wait_for_async(lambda: bool(alerts.of("hot", "resolved")), timeout=30)
        resolved = alerts.of("hot", "resolved")[0]
        assert resolved["id"] == fired["id"] and resolved["state"] == "resolved"
        await asyncio.sleep(1.0)  # more evaluations: each transition was stated once
        assert (len(alerts.of("hot", "fired")), len(alerts.of("hot", "resolved"))) == (1, 1)
        rules = await bus.ask("list_alert_rules")
        mine = next(r for r in rules["rules"] if r["name"] == "hot")
        assert mine["last_error"] is None and mine["last_evaluated_at"]
        assert {r["id"] for r in rules["rules"] if r["builtin"]} >= {"builtin-gpu-xid"}


async def test_an_xid_fires_the_builtin_rule_and_puts_the_node_into_maintenance(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix, tmp_path) as (bus, gpu, alerts):
        minion = gpu.labels[0]
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "lab"})
        await bus.ask("add_node", {"region": "lab", "name": "box", "minion_id": minion})
        await bus.send(registration(minion, bus.account, "lab", hardware=good_hw()))

        async def active() -> bool:
            return (await node(bus, minion))["state"] == "active"

        await wait_for_async(active, timeout=10)
        await scraped(gpu.prometheus, "gpufleet_gpu_xid_errors_total")  # at 0 first
        gpu.xids, gpu.last_xid = 1, 79
        await wait_for_async(lambda: bool(alerts.of("gpu-xid-error", "fired")), timeout=30)
        fired = alerts.of("gpu-xid-error", "fired")[0]
        assert fired["value"] == 79 and fired["labels"]["node"] == minion
        assert fired["account"] == bus.account  # the node's owner, whose job it is too

        async def in_maintenance() -> bool:
            return (await node(bus, minion))["state"] == "maintenance"

        await wait_for_async(in_maintenance, timeout=10)
        history = (await node(bus, minion))["history"]
        assert history[-1]["reason"].startswith("alert gpu-xid-error: GPU 0 of node"), history
        seen = await bus.ask("list_alerts", {})
        assert fired["id"] in [a["id"] for a in seen["alerts"]]  # a built-in's, about its series


async def test_an_xid_injected_into_a_node_agents_simulated_gpu_fires_the_builtin_rule(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    minion = f"x-{uuid.uuid4().hex[:6]}"
    state, port = tmp_path / "agent", free_port()
    async with running_agent(nats_server, state, minion, MetricsSettings(port=port)):
        with running_prometheus([f"127.0.0.1:{port}"], tmp_path, scrape_interval_s=0.5) as prom:
            settings = {"prometheus_url": prom.url, "alert_eval_s": 0.3}
            async with provisioner(nats_server, mongo_server, db_prefix, **settings) as bus:
                alerts = Alerts()
                await bus.nc.subscribe(subjects.event("alert", "*"), cb=alerts.on)
                xids = f'gpufleet_gpu_xid_errors_total{{node="{minion}"}}'
                await scraped(prom.url, xids)  # its counters at 0 first
                control = {"gpus": {"1": {"xid": [48]}}}
                (state / "simulated-telemetry.json").write_text(json.dumps(control))
                await wait_for_async(lambda: bool(alerts.of("gpu-xid-error", "fired")), timeout=30)
                await asyncio.sleep(1.0)
    fired = alerts.of("gpu-xid-error", "fired")
    assert len(fired) == 1, fired  # GPU 1 only, once
    labels = fired[0]["labels"]
    assert (labels["node"], labels["gpu"], labels["owner"]) == (minion, "1", "local")
    assert fired[0]["value"] == 48 and fired[0]["account"] == "local"
    assert fired[0]["annotations"]["summary"] == f"GPU 1 of node {minion} raised XID 48"


async def test_an_account_sees_and_removes_only_its_own_rules_and_alerts(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    bounded = fleet(nats_server, mongo_server, db_prefix, tmp_path, alert_rules_per_account=2)
    async with bounded as (bus, gpu, alerts):
        hot = {"series": "gpufleet_gpu_temperature_celsius", "comparison": ">", "threshold": 85}
        rule = await bus.ask("add_alert_rule", {"name": "hot", **hot})
        taken = await bus.ask("add_alert_rule", {"name": "hot", **hot})
        assert taken["error"]["code"] == "conflict", taken
        await bus.ask("add_alert_rule", {"name": "warm", **hot, "threshold": 80})
        third = await bus.ask("add_alert_rule", {"name": "third", **hot})
        assert third["error"]["fields"][0]["rule"] == "limit:alert_rules", third
        gpu.temperature = 95.0
        await wait_for_async(lambda: bool(alerts.of("hot", "fired")), timeout=30)
        fired_id = alerts.of("hot", "fired")[0]["id"]

        other = f"acct-{uuid.uuid4().hex[:6]}"
        creds = nats_server.creds("user", "v", account=other)
        nc = await nats.connect(nats_server.url, **nats_server.client(creds))
        try:
            intruder = Bus(nats_server, bus.nc, nc, other)
            names = [r["name"] for r in (await intruder.ask("list_alert_rules"))["rules"]]
            assert "hot" not in names
            assert (await intruder.ask("list_alerts"))["alerts"] == []
            for ref in (rule["id"], "hot"):
                gone = await intruder.ask("remove_alert_rule", {"rule": ref})
                assert gone["error"]["code"] == "not_found", gone
            # its own rule over the first account's series: refused, naming the field
            spy = await intruder.ask(
                "add_alert_rule",
                {"name": "spy", **hot, "matchers": [{"label": "account", "value": bus.account}]},
            )
            assert spy["error"]["fields"][0]["field"] == "matchers.0.label", spy
            # an account in the body is not the acting account: the server's is forced
            own = await intruder.ask(
                "add_alert_rule", {"name": "mine", **hot, "account": bus.account}
            )
            assert own["account"] == other and f'account="{other}"' in own["query"], own
            expr = await intruder.ask("add_alert_rule", {"name": "x", "expr": "up"})
            assert expr["error"]["fields"][0]["field"] == "expr"
            await asyncio.sleep(1.0)
            assert alerts.of("mine", "fired") == []  # nothing of the first account's fires
            builtin = await intruder.ask("remove_alert_rule", {"rule": "builtin-gpu-xid"})
            assert builtin["error"]["code"] == "conflict"
        finally:
            await nc.close()
        # operators: an expression, checked by Prometheus; every account's alerts
        bad = await operator(bus, "add_alert_rule", {"name": "bad", "expr": "rate(up["})
        assert bad["error"]["fields"][0]["field"] == "expr", bad
        ok = await operator(bus, "add_alert_rule", {"name": "any-hot", "expr": "up == 0"})
        assert ok["account"] is None and ok["query"] == "up == 0"
        every = await operator(bus, "list_alerts", {"account": bus.account})
        assert fired_id in [a["id"] for a in every["alerts"]]
        removed = await bus.ask("remove_alert_rule", {"rule": "hot"})
        assert removed["id"] == rule["id"]
        await wait_for_async(lambda: bool(alerts.of("hot", "resolved")), timeout=10)
        left = (await bus.ask("list_alerts"))["alerts"]
        assert [a for a in left if a["rule_id"] == rule["id"]] == []


async def operator(bus: Bus, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await bus.nc.request(
        subjects.admin("provisioner", verb), json.dumps(body).encode(), timeout=10
    )
    data: dict[str, Any] = json.loads(reply.data)
    return data


async def scraped(url: str, expr: str) -> None:
    """Until Prometheus holds `expr` (its first scrape of a new target may take seconds)."""

    async def held() -> bool:
        return bool(await asyncio.to_thread(query, url, expr))

    await wait_for_async(held, timeout=20)


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()
