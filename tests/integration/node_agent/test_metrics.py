"""The node agent's /metrics with simulated GPUs and running jobs: every GPU sample of a
running job carries its job and account, over HTTP and in a real Prometheus."""

from __future__ import annotations

import asyncio
import os
import urllib.request
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from gpufleet_bus import publish
from gpufleet_contracts.jobs import WorkerStarted
from gpufleet_devstack import NatsServer, wait_for_async
from gpufleet_devstack.processes import free_port
from gpufleet_devstack.prometheus import find_prometheus, query, running_prometheus
from gpufleet_telemetry.exposition import MetricsSettings
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ..conftest import JsPublisher
from .test_node_agent import PY, client, events_of, running_agent, start_cmd

SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def scrape(port: int) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def gpu_samples(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if s.name.startswith("gpufleet_gpu_")]


async def test_every_gpu_sample_of_a_running_job_has_its_job(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    minion = f"it-{uuid.uuid4().hex[:8]}"
    port = free_port()
    whole = start_cmd(minion, SLEEP, uuid.uuid4().hex)  # GPU 1
    halves = [
        start_cmd(minion, SLEEP, uuid.uuid4().hex).model_copy(
            update={"gpu_indices": [0], "gpu_fraction": Decimal("0.5")}
        )
        for _ in range(2)
    ]
    jobs = {whole.job_id: "1", halves[0].job_id: "0", halves[1].job_id: "0"}
    async with (
        client(nats_server) as nc,
        running_agent(
            nats_server,
            tmp_path / "state",
            minion,
            metrics=MetricsSettings(port=port),
            stop_workers_on_exit=True,
            region="eu-test",
        ) as agent,
    ):
        js = nc.jetstream()
        # idle: one series per GPU, with empty job and account
        await wait_for_async(lambda: agent.metrics.samples, timeout=10)
        idle = gpu_samples(await asyncio.to_thread(scrape, port))
        assert idle and {(s.labels["job"], s.labels["account"]) for s in idle} == {("", "")}
        assert {s.labels["node"] for s in idle} == {minion}

        sched = JsPublisher(nc)
        for cmd in [whole, *halves]:
            await publish(sched, cmd, source="gpufleet/scheduler")
        for cmd in [whole, *halves]:
            await wait_for_async(
                lambda cmd=cmd: events_of(js, WorkerStarted, cmd.placement_id), timeout=30
            )
        beats = agent.metrics.samples
        await wait_for_async(lambda: agent.metrics.samples is not beats, timeout=10)

        samples = await asyncio.to_thread(scrape, port)
        held = gpu_samples(samples)
        assert held
        for s in held:
            assert s.labels["job"], s  # no sample of a held GPU without its job
            assert jobs[s.labels["job"]] == s.labels["gpu"]
            assert (s.labels["account"], s.labels["owner"]) == ("local", "local")
            assert (s.labels["node"], s.labels["region"]) == (minion, "eu-test")
        util = {
            s.labels["job"]: s.value for s in held if s.name == "gpufleet_gpu_utilization_percent"
        }
        assert set(util) == set(jobs) and all(v > 50 for v in util.values())
        node = {s.name for s in samples if s.name.startswith("gpufleet_node_")}
        assert {"gpufleet_node_cpu_percent", "gpufleet_node_memory_total_bytes"} <= node
        assert {"gpufleet_node_disk_used_bytes", "gpufleet_node_disk_read_bytes_total"} <= node

        if find_prometheus() is None:  # CI's `just test` installs it (just setup)
            if os.environ.get("CI"):
                pytest.fail("prometheus is not installed")
            pytest.skip("prometheus is not installed (`just setup` installs it)")
        with running_prometheus([f"127.0.0.1:{port}"], tmp_path, 0.5) as prom:
            expr = f'gpufleet_gpu_utilization_percent{{node="{minion}"}}'

            def stored() -> list[dict[str, object]]:
                found = query(prom.url, expr)
                return found if len(found) == 3 else []

            await wait_for_async(lambda: asyncio.to_thread(stored), timeout=30)
            series = await asyncio.to_thread(query, prom.url, expr)
            labels = [r["metric"] for r in series]
            assert sorted((m["job"], m["gpu"], m["account"]) for m in labels) == sorted(
                (job, gpu, "local") for job, gpu in jobs.items()
            )
            shared = f'count by (gpu_uuid) ({expr[:-1]}, gpu="0"}})'
            (row,) = await asyncio.to_thread(query, prom.url, shared)
            assert row["value"][1] == "2"  # one series per job sharing GPU 0
