"""One trace per job (gpufleet_bus.tracing): the W3C trace context carried in headers and
the outbox, spans only for sampled traces, and what a client or a node sends checked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from faststream.nats import NatsBroker
from gpufleet_bus import tracing
from gpufleet_bus.requests import Requests
from gpufleet_contracts import subjects
from gpufleet_contracts.health import HealthCheck
from gpufleet_store import SecretBox, Transaction
from gpufleet_store.store import FORMAT, FORMAT_TRACED, outbox_documents, outbox_traced
from gpufleet_telemetry.spanfile import SpanFileExporter, read_spans, trace_of_job, tree
from opentelemetry import trace as otel
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

pytestmark = pytest.mark.unit

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SAMPLED = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
UNSAMPLED = f"00-{TRACE_ID}-00f067aa0ba902b7-00"


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span the process ends, in memory (the global provider, set once per process)."""
    provider = otel.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        otel.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture
def ended(spans: InMemorySpanExporter) -> InMemorySpanExporter:
    spans.clear()
    return spans


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        UNSAMPLED.upper(),  # hex is lowercase
        f"01-{TRACE_ID}-00f067aa0ba902b7-01",  # only version 00 is followed
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # an all-zero trace id is invalid
        f"00-{TRACE_ID}-{'0' * 16}-01",  # and an all-zero span id
        SAMPLED + "-extra",
        SAMPLED[:-1],
        SAMPLED[:20] + "\r\nX-Evil: 1" + SAMPLED[31:],
        42,
    ],
)
def test_a_malformed_traceparent_is_ignored(value: Any) -> None:
    assert tracing.from_headers({subjects.TRACEPARENT: value}) is None


def test_a_well_formed_trace_is_kept_with_its_state_and_a_bad_state_is_dropped() -> None:
    assert tracing.from_headers({subjects.TRACEPARENT: SAMPLED}) == SAMPLED
    good = {subjects.TRACEPARENT: SAMPLED, subjects.TRACESTATE: "vendor=a1,other=b2"}
    trace = tracing.from_headers(good)
    assert trace == f"{SAMPLED}\nvendor=a1,other=b2"
    assert tracing.add_headers({}, trace) == good
    for bad in ("x" * 600, "a=1\nb=2", "é=1"):
        headers = {subjects.TRACEPARENT: SAMPLED, subjects.TRACESTATE: bad}
        assert tracing.from_headers(headers) == SAMPLED


def test_an_unsampled_trace_is_a_header_copy_and_no_span(ended: InMemorySpanExporter) -> None:
    assert tracing.current() is None
    with tracing.handling(UNSAMPLED, "gpufleet.v1.cmd.worker.*.start", message_id="m1"):
        assert tracing.current() == UNSAMPLED
        assert tracing.add_headers({}) == {subjects.TRACEPARENT: UNSAMPLED}
        assert otel.get_current_span() is otel.INVALID_SPAN  # no OpenTelemetry context at all
        assert tracing.mark(UNSAMPLED, "place worker") == UNSAMPLED
    assert tracing.current() is None
    with tracing.batch([UNSAMPLED, None], "gpufleet.v1.evt.worker.*.*"):
        pass
    assert ended.get_finished_spans() == ()


def test_a_sampled_trace_gets_a_messaging_span_whose_children_continue_it(
    ended: InMemorySpanExporter,
) -> None:
    with tracing.handling(SAMPLED, "gpufleet.v1.cmd.worker.*.start", message_id="m1"):
        inner = tracing.current()
        assert inner is not None and tracing.sampled(inner)
        assert tracing.trace_id(inner) == TRACE_ID and inner != SAMPLED
        placed = tracing.mark(inner, "place worker", {"gpufleet.job.id": "j1"})
    (mark, process) = ended.get_finished_spans()
    assert process.name == "process gpufleet.v1.cmd.worker.*.start"
    assert process.kind is otel.SpanKind.CONSUMER
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == "nats"
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.message.id"] == "m1"
    assert process.parent is not None and process.parent.span_id == 0x00F067AA0BA902B7
    assert mark.parent is not None and mark.parent.span_id == process.context.span_id
    assert {f"{s.context.trace_id:032x}" for s in (mark, process)} == {TRACE_ID}
    assert placed == f"00-{TRACE_ID}-{mark.context.span_id:016x}-01"


def test_a_batch_gets_one_span_per_sampled_message_each_in_its_own_trace(
    ended: InMemorySpanExporter,
) -> None:
    other = tracing.mint(True)
    with tracing.batch([SAMPLED, UNSAMPLED, other, None], "gpufleet.v1.evt.worker.*.*"):
        assert tracing.current() is None
    got = {f"{s.context.trace_id:032x}" for s in ended.get_finished_spans()}
    assert got == {TRACE_ID, tracing.trace_id(other)}


def test_a_root_is_sampled_by_the_ratio(ended: InMemorySpanExporter) -> None:
    try:
        tracing.set_sample_ratio(0.0)
        with tracing.root("submit job", {"gpufleet.job.id": "j1"}) as trace:
            assert not tracing.sampled(trace) and tracing.current() == trace
        assert ended.get_finished_spans() == ()
        tracing.set_sample_ratio(1.0)
        with tracing.root("submit job", {"gpufleet.job.id": "j1"}) as trace:
            assert tracing.sampled(trace)
        (span,) = ended.get_finished_spans()
        assert span.parent is None and f"{span.context.trace_id:032x}" == trace[3:35]
    finally:
        tracing.set_sample_ratio(0.1)


def test_a_node_can_neither_move_a_job_to_another_trace_nor_sample_it() -> None:
    kept = UNSAMPLED
    same = f"00-{TRACE_ID}-1111111111111111-00"
    assert tracing.within(kept, same) == same  # its own span of the job's trace
    assert tracing.within(kept, f"00-{TRACE_ID}-1111111111111111-01") == kept
    assert tracing.within(kept, tracing.mint(False)) == kept
    assert tracing.within(None, same) is None


def test_the_outbox_keeps_each_messages_trace() -> None:
    tx = Transaction(session=None, box=SecretBox(Fernet.generate_key().decode()))  # type: ignore[arg-type]
    tx.emit("s.a", "t.a", b"one", "1", trace=f"{SAMPLED}\nk=v")
    tx.emit("s.b", "t.b", b"two", "2", sealed=True, trace=UNSAMPLED)
    tx.emit("s.c", "t.c", b"three", "3")
    (doc,) = outbox_documents(tx.outbox)
    assert doc["messages"][0] == FORMAT_TRACED
    assert list(outbox_traced(doc, tx.box)) == [
        ("1", "s.a", "t.a", b"one", f"{SAMPLED}\nk=v"),
        ("2", "s.b", "t.b", b"two", UNSAMPLED),
        ("3", "s.c", "t.c", b"three", None),
    ]
    untraced = Transaction(session=None)  # type: ignore[arg-type]
    untraced.emit("s.a", "t.a", b"one", "1")
    (plain,) = outbox_documents(untraced.outbox)
    assert plain["messages"][0] == FORMAT  # as before: no trace, no extra bytes


class Echo(BaseModel):
    pass


@pytest.mark.parametrize("by_account", [True, False])
async def test_an_accounts_request_starts_no_trace_of_its_own(by_account: bool) -> None:
    """A client's traceparent is not followed (it could sample every job); a service's or a
    node's request continues the trace its headers carry."""
    seen: list[str | None] = []

    async def health(body: HealthCheck, *who: str) -> Echo:
        seen.append(tracing.current())
        return Echo()

    requests = Requests("test", NatsBroker(), NatsBroker())
    subject = "gpufleet.v1.rpc.test.health.*" if by_account else "gpufleet.v1.adm.test.health"
    requests.add(subject, health, by_account=by_account, queue="q", title="t")
    asked = "gpufleet.v1.rpc.test.health.acme" if by_account else subject
    await requests.answer(requests.routes[0], asked, b"{}", {subjects.TRACEPARENT: UNSAMPLED})
    assert seen == [None if by_account else UNSAMPLED]


def test_spans_written_as_json_lines_read_back_as_one_jobs_tree(
    tmp_path: Any, ended: InMemorySpanExporter
) -> None:
    try:
        tracing.set_sample_ratio(1.0)
        job = {"gpufleet.job.id": "j1"}
        with (
            tracing.root("submit job", job) as trace,
            tracing.handling(trace, "gpufleet.v1.cmd.worker.*.start"),
        ):
            tracing.mark(tracing.current(), "run worker")
    finally:
        tracing.set_sample_ratio(0.1)
    SpanFileExporter(tmp_path / "scheduler-1.jsonl").export(ended.get_finished_spans())
    (tmp_path / "billing-2.jsonl").write_text('{"cut short')
    spans = trace_of_job(read_spans(tmp_path), "j1")
    assert len(spans) == 3
    lines = tree(spans)
    assert [line.split("  ")[-1] for line in lines] == [
        "submit job",
        "process gpufleet.v1.cmd.worker.*.start",
        "run worker",
    ]
    assert [len(line) - len(line.lstrip()) for line in lines] == [0, 2, 4]
