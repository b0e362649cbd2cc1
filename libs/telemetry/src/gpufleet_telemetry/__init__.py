"""OpenTelemetry traces and metrics plus structured logs, configured once per process.

`configure("scheduler")` sets a tracer and a meter provider named after the service and
JSON (or text) logs on stderr. With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans and metrics go
there over OTLP/gRPC; otherwise they stay in process and nothing is printed, so a developer's
terminal stays readable. With `GPUFLEET_TRACE_DIR` set, spans are also written there as JSON
lines (spanfile.py; `just up` sets it, `just trace <job>` shows one job's trace).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from pydantic_settings import BaseSettings, SettingsConfigDict

_configured: dict[str, tuple[TracerProvider, MeterProvider]] = {}

# Keys that must never reach a log line, whatever a caller passes in `extra`.
SECRET_KEYS = frozenset({"password", "private_key", "secret", "token", "key_json", "credentials"})


class TelemetrySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")
    log_level: str = "INFO"
    log_format: str = "text"  # text | json
    trace_dir: Path | None = None  # spans as JSON lines, one file per process (spanfile.py)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra` fields."""

    _std = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in self._std and not k.startswith("_"):
                out[k] = "***" if k.lower() in SECRET_KEYS else v
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            out["trace_id"] = f"{span.trace_id:032x}"
            out["span_id"] = f"{span.span_id:016x}"
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(
    service: str, settings: TelemetrySettings | None = None
) -> tuple[TracerProvider, MeterProvider]:
    if _configured:  # one process, one set of providers (tests run several apps in one)
        return next(iter(_configured.values()))
    settings = settings or TelemetrySettings()
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    tracer_provider = TracerProvider(resource=resource)
    readers: list[Any] = []
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        except ImportError:
            logging.getLogger(__name__).warning(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed"
            )
    if settings.trace_dir is not None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from .spanfile import SpanFileExporter

        path = settings.trace_dir / f"{service}-{os.getpid()}.jsonl"
        tracer_provider.add_span_processor(BatchSpanProcessor(SpanFileExporter(path)))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    _configured[service] = (tracer_provider, meter_provider)
    return tracer_provider, meter_provider


def meter(name: str) -> metrics.Meter:
    return metrics.get_meter(name)
