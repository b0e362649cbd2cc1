"""Prometheus `/metrics` for a service or a node agent: families gathered at each scrape.

A source is an async function that returns prometheus-client metric families built from what
the process holds at that moment (the agent's last sample and its placements, the scheduler's
memory) or reads from its store. Nothing is recorded between scrapes, so a job that ended is
gone from the next scrape, and a series' labels are always those of now (docs/metrics.md).

The endpoint is off unless `GPUFLEET_METRICS_PORT` names a port; it listens on
`GPUFLEET_METRICS_HOST` (loopback by default: the agent's series name other accounts' jobs).
A source that fails is logged and left out of that scrape, and says so in
`gpufleet_metrics_source_up{source}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("gpufleet.metrics")

REQUEST_LIMIT = 8192  # bytes of a scrape's request head read, at most
READ_TIMEOUT_S = 5.0


class MetricsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_METRICS_", extra="ignore")
    port: int = Field(default=0, ge=0, le=65535)  # 0: no /metrics
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class Source:
    """A named async function returning this scrape's families."""

    name: str
    collect: Callable[[], Awaitable[Iterable[Metric]]]


class _Gathered:
    """The families of one scrape, in the shape `generate_latest` reads."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


async def render(sources: Sequence[Source]) -> bytes:
    """The text exposition of every source's families now."""
    families: list[Metric] = []
    up = GaugeMetricFamily(
        "gpufleet_metrics_source_up",
        "1 when the source's families are in this scrape, 0 when it failed (logged).",
        labels=["source"],
    )
    for source in sources:
        try:
            families.extend(await source.collect())
        except Exception:
            log.exception("metrics source %s failed; left out of this scrape", source.name)
            up.add_metric([source.name], 0)
        else:
            up.add_metric([source.name], 1)
    families.append(up)
    return generate_latest(_Gathered(families))


class MetricsServer:
    """`GET /metrics` over HTTP/1.1 on asyncio, in the process's own loop (a source may
    await its store); one response per connection."""

    def __init__(self, sources: Sequence[Source], host: str, port: int) -> None:
        self.sources = list(sources)
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listening; returns the port (the one the system chose for port 0)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        bound = int(self._server.sockets[0].getsockname()[1])
        log.info("metrics on http://%s:%d/metrics", self.host, bound)
        return bound

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            if len(head) > REQUEST_LIMIT:
                raise ValueError("request head too long")
            method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if method != "GET":
                await _answer(writer, 405, "text/plain", b"only GET\n")
            elif target.split("?", 1)[0] != "/metrics":
                await _answer(writer, 404, "text/plain", b"see /metrics\n")
            else:
                await _answer(writer, 200, CONTENT_TYPE_LATEST, await render(self.sources))
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            with contextlib.suppress(OSError):
                await _answer(writer, 400, "text/plain", b"bad request\n")
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _answer(writer: asyncio.StreamWriter, status: int, kind: str, body: bytes) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
        + body
    )
    await writer.drain()
