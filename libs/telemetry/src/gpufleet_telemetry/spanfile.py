"""Spans as JSON lines in a file, for development (`GPUFLEET_TRACE_DIR`), and one trace read
back from such files as an indented tree.

One file per process (`<service>-<pid>.jsonl`), appended to by the tracer provider's batch
processor; a line is one span: its trace and span ids, its parent's, its name, kind, service,
start and end (nanoseconds since the epoch) and attributes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "name": span.name,
        "kind": span.kind.name.lower(),
        "service": span.resource.attributes.get("service.name", ""),
        "start": span.start_time,
        "end": span.end_time,
        "attributes": dict(span.attributes or {}),
    }


class SpanFileExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def read_spans(directory: Path) -> Iterator[dict[str, Any]]:
    """Every span written under `directory` (a line cut short by a process writing it is
    skipped)."""
    for path in sorted(directory.glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue


def trace_of_job(spans: Iterable[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    """The spans of the trace of job `job_id` (the trace whose spans name it), or []."""
    spans = list(spans)
    ids = {s["trace_id"] for s in spans if s["attributes"].get("gpufleet.job.id") == job_id}
    return [s for s in spans if s["trace_id"] in ids]


def tree(spans: Sequence[dict[str, Any]]) -> list[str]:
    """One line per span, indented under its parent, children by start time: `+ms` from the
    trace's first span, duration, service, name. A span whose parent is not among them (not
    sampled, or written by a process still running) starts a tree of its own."""
    if not spans:
        return []
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:
        parent = s["parent_id"] if s["parent_id"] in by_id else None
        children.setdefault(parent, []).append(s)
    t0 = min(s["start"] for s in spans)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: x["start"]):
            at = (s["start"] - t0) / 1e6
            took = ((s["end"] or s["start"]) - s["start"]) / 1e6
            lines.append(f"{'  ' * depth}+{at:.1f} ms {took:.1f} ms  {s['service']}  {s['name']}")
            walk(s["span_id"], depth + 1)

    walk(None, 0)
    return lines
