"""Prometheus's HTTP API, as the alert evaluation reads it: one instant query at a time
(`POST /api/v1/query`), its instant vector as samples."""

from __future__ import annotations

import math
from typing import Any

import httpx

from .states import Sample


class PrometheusError(Exception):
    """Prometheus did not answer, or failed the query (the rule's alerts stay as they are)."""


class BadQuery(PrometheusError):
    """Prometheus refused the expression itself (its parser, or its result's type)."""


class Prometheus:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.client = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout_s)

    async def query(self, promql: str) -> list[Sample]:
        """The instant vector (or scalar) `promql` evaluates to now."""
        try:
            response = await self.client.post("/api/v1/query", data={"query": promql})
            body: dict[str, Any] = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PrometheusError(f"Prometheus did not answer: {exc}") from exc
        if body.get("status") != "success":
            why = str(body.get("error") or f"HTTP {response.status_code}")
            if body.get("errorType") == "bad_data":
                raise BadQuery(why)
            raise PrometheusError(why)
        data = body.get("data") or {}
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar" and isinstance(result, list):
            return _finite([Sample({}, float(result[1]))])
        if kind != "vector":
            raise BadQuery(f"the expression gives a {kind}, not an instant vector")
        return _finite(
            Sample(
                {k: str(v) for k, v in (row.get("metric") or {}).items() if k != "__name__"},
                float(row["value"][1]),
            )
            for row in result or []
        )

    async def check(self, promql: str) -> None:
        """Raises BadQuery if Prometheus refuses `promql` (a failure to ask is let pass: the
        rule's evaluations will say so)."""
        try:
            await self.query(promql)
        except BadQuery:
            raise
        except PrometheusError:
            return

    async def close(self) -> None:
        await self.client.aclose()


def _finite(samples: Any) -> list[Sample]:
    """NaN compares false with everything: such a sample is no alert."""
    return [s for s in samples if not math.isnan(s.value)]
