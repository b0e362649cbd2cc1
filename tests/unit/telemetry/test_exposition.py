"""/metrics rendering: every source's families, a failing source left out and said so."""

from __future__ import annotations

import asyncio

from gpufleet_telemetry.exposition import MetricsServer, Source, render
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families


async def good() -> list[Metric]:
    g = GaugeMetricFamily("gpufleet_example", "An example.", labels=["job"])
    g.add_metric(["j-1"], 3)
    return [g]


async def broken() -> list[Metric]:
    raise RuntimeError("the store is away")


def parsed(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


def test_a_failing_source_is_left_out_and_reported() -> None:
    out = parsed(asyncio.run(render([Source("good", good), Source("broken", broken)])))
    assert out == {
        ("gpufleet_example", (("job", "j-1"),)): 3.0,
        ("gpufleet_metrics_source_up", (("source", "good"),)): 1.0,
        ("gpufleet_metrics_source_up", (("source", "broken"),)): 0.0,
    }


def test_the_server_answers_get_metrics_only() -> None:
    async def run() -> tuple[bytes, bytes]:
        server = MetricsServer([Source("good", good)], "127.0.0.1", 0)
        port = await server.start()
        try:
            answers = []
            for line in (b"GET /metrics HTTP/1.1", b"GET / HTTP/1.1"):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(line + b"\r\nHost: x\r\n\r\n")
                answers.append(await reader.read())
                writer.close()
            return answers[0], answers[1]
        finally:
            await server.stop()

    metrics, other = asyncio.run(run())
    assert metrics.startswith(b"HTTP/1.1 200 OK") and b'gpufleet_example{job="j-1"} 3.0' in metrics
    assert other.startswith(b"HTTP/1.1 404")
