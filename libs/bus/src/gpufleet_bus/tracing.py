"""One trace per job: the W3C trace context in the headers of every message of a job's work,
and spans only for the jobs whose trace is sampled.

A job's trace is minted when it is submitted (`root`, the scheduler's SubmitJob) and stored
with it, so that work a timer or another message starts (its placement, its node's reports,
its ledger entry) continues it (`continuing`, `mark`, an explicit `trace=` to `emit` and
`publish`). A trace is the `traceparent` header's value, and `tracestate`'s after a line
break when there is one: a string, copied from message to message.

Sampling is decided once, at the root, by `GPUFLEET_TRACE_SAMPLE_RATIO`, and every later
step only reads the sampled flag of the trace it continues (parent-based). An unsampled trace
costs a header copy: no span, no OpenTelemetry context, no object beyond the string. A
sampled one gets an OpenTelemetry span per step, named and described by the OpenTelemetry
messaging conventions (`process <subject>`, `messaging.*` attributes).

What a message carries is checked before it is followed (`from_headers`): a malformed
`traceparent` is ignored, and an account's request starts no trace of its own (gpufleet_bus
.requests does not follow one), so a client can neither make the control plane trace every
job nor put what it likes into its headers.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpufleet_contracts.subjects import TRACEPARENT, TRACESTATE
from opentelemetry import trace as otel
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import TraceState
from pydantic_settings import BaseSettings, SettingsConfigDict

# version 00, lowercase hex, neither id all zeros (the specification's "invalid" values)
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
# at most 32 list members of printable ASCII, 512 characters in all (the specification's
# limits); anything else is dropped, the traceparent kept
_TRACESTATE = re.compile(r"[\x20-\x2b\x2d-\x7e]{1,256}(,[\x20-\x2b\x2d-\x7e]{0,256}){0,31}")
TRACESTATE_MAX = 512

_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("gpufleet_trace")
_NOTHING = contextlib.nullcontext()
_tracer = otel.get_tracer("gpufleet")


class TraceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")
    # The share of jobs whose trace is sampled (0: none, 1: every job).
    trace_sample_ratio: float = 0.1


_ratio: list[float] = []  # read once per process


def sample_ratio() -> float:
    if not _ratio:
        _ratio.append(min(1.0, max(0.0, TraceSettings().trace_sample_ratio)))
    return _ratio[0]


def set_sample_ratio(ratio: float) -> None:
    """For a process that sets its ratio itself (tests, benchmarks)."""
    _ratio[:] = [min(1.0, max(0.0, ratio))]


def current() -> str | None:
    """The trace the running task continues, if any."""
    return _CURRENT.get(None)


def sampled(trace: str | None) -> bool:
    return trace is not None and int(trace[53:55], 16) & 1 == 1


def trace_id(trace: str) -> str:
    return trace[3:35]


def from_headers(headers: Mapping[str, Any] | None) -> str | None:
    """The trace a message's headers carry, or None: none, or one that is not well-formed."""
    if not headers:
        return None
    parent = headers.get(TRACEPARENT)
    if not isinstance(parent, str) or len(parent) != 55 or not _TRACEPARENT.fullmatch(parent):
        return None
    state = headers.get(TRACESTATE)
    if isinstance(state, str) and len(state) <= TRACESTATE_MAX and _TRACESTATE.fullmatch(state):
        return f"{parent}\n{state}"
    return parent


def add_headers(headers: dict[str, str], trace: str | None = None) -> dict[str, str]:
    """`headers` with the trace's (`trace`, or else the current one), if any."""
    trace = trace or _CURRENT.get(None)
    if trace:
        parent, _, state = trace.partition("\n")
        headers[TRACEPARENT] = parent
        if state:
            headers[TRACESTATE] = state
    return headers


def mint(sample: bool | None = None) -> str:
    """A new trace, sampled by the configured ratio unless `sample` says."""
    if sample is None:
        sample = random.random() < sample_ratio()
    return _format(random.getrandbits(128) or 1, random.getrandbits(64) or 1, sample, "")


def within(kept: str | None, reported: str | None) -> str | None:
    """What a message of a job a node reported continues: the node's trace if it is the
    job's (`kept`, stored with it) and sampled alike, else the job's own. A node can neither
    move a job to another trace nor sample one that is not."""
    if (
        kept is None
        or reported is None
        or reported[3:35] != kept[3:35]
        or reported[53:55] != kept[53:55]
    ):
        return kept
    return reported


def continuing(trace: str | None) -> contextlib.AbstractContextManager[None]:
    """Within it, messages sent and emitted carry `trace` (no span: see `handling`)."""
    if trace is None:
        return _NOTHING
    return _continuing(trace)


@contextlib.contextmanager
def _continuing(trace: str) -> Iterator[None]:
    token = _CURRENT.set(trace)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def handling(
    trace: str | None,
    subject: str,
    *,
    message_id: str | None = None,
    kind: SpanKind = SpanKind.CONSUMER,
) -> contextlib.AbstractContextManager[None]:
    """Handling one message of `trace`: what it sends continues the trace; a span `process
    <subject>` when the trace is sampled, none otherwise."""
    if trace is None:
        return _NOTHING
    if not sampled(trace):
        return _continuing(trace)
    return _span(trace, f"process {subject}", kind, _messaging(subject, message_id))


def root(
    name: str, attributes: Mapping[str, str] | None = None
) -> contextlib.AbstractContextManager[str]:
    """A new trace (a job's, minted at its submission), sampled by the configured ratio;
    yields it. Sampled: the root span `name`, whose trace it is."""
    if random.random() >= sample_ratio():
        return _minted(mint(False))
    return _root(name, attributes)


@contextlib.contextmanager
def _minted(trace: str) -> Iterator[str]:
    token = _CURRENT.set(trace)
    try:
        yield trace
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def _root(name: str, attributes: Mapping[str, str] | None) -> Iterator[str]:
    with _tracer.start_as_current_span(
        name, context=Context(), kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        # no SDK provider in this process (a test's): the job's trace is minted unsampled
        trace = _of(span, "") if span.get_span_context().is_valid else mint(False)
        token = _CURRENT.set(trace)
        try:
            yield trace
        finally:
            _CURRENT.reset(token)


def mark(
    trace: str | None,
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    start: datetime | None = None,
) -> str | None:
    """A step of `trace` done outside any one message's handling (a placement in a pass of
    many, a worker's run): a span from `start` (default: now) to now if the trace is sampled;
    returns the trace its messages then carry."""
    if trace is None or not sampled(trace):
        return trace
    at = None if start is None else int(start.timestamp() * 1e9)
    span = _tracer.start_span(name, context=_parent(trace), attributes=attributes, start_time=at)
    span.end()
    return _of(span, _state(trace)) if span.get_span_context().is_valid else trace


@contextlib.contextmanager
def batch(
    traces: Sequence[str | None], subject: str, ids: Sequence[str | None] = ()
) -> Iterator[None]:
    """Handling a batch of messages at once (one transaction): a span `process <subject>`
    for each sampled one, each a child of its own message's trace, all ending with the
    batch. The messages' traces are not made current: the batch's handler passes each on
    where it emits for that message (`Delivery.trace`)."""
    spans: list[Span] = []
    size = len(traces)
    for n, trace in enumerate(traces):
        if trace is not None and sampled(trace):
            attributes = _messaging(subject, ids[n] if n < len(ids) else None)
            attributes["messaging.batch.message_count"] = size
            spans.append(
                _tracer.start_span(
                    f"process {subject}",
                    context=_parent(trace),
                    kind=SpanKind.CONSUMER,
                    attributes=attributes,
                )
            )
    try:
        yield
    finally:
        for span in spans:
            span.end()


@contextlib.contextmanager
def _span(trace: str, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Iterator[None]:
    with _tracer.start_as_current_span(
        name, context=_parent(trace), kind=kind, attributes=attributes
    ) as span:
        valid = span.get_span_context().is_valid
        token = _CURRENT.set(_of(span, _state(trace)) if valid else trace)
        try:
            yield
        finally:
            _CURRENT.reset(token)


def _messaging(subject: str, message_id: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": subject,
    }
    if message_id:
        attributes["messaging.message.id"] = message_id
    return attributes


def _parent(trace: str) -> Context:
    state = _state(trace)
    parent = SpanContext(
        int(trace[3:35], 16),
        int(trace[36:52], 16),
        is_remote=True,
        trace_flags=TraceFlags(int(trace[53:55], 16)),
        trace_state=TraceState.from_header([state]) if state else None,
    )
    return otel.set_span_in_context(NonRecordingSpan(parent))


def _state(trace: str) -> str:
    return trace.partition("\n")[2]


def _of(span: Span, state: str) -> str:
    ctx = span.get_span_context()
    return _format(ctx.trace_id, ctx.span_id, bool(ctx.trace_flags & 1), state)


def _format(trace_id: int, span_id: int, sample: bool, state: str) -> str:
    parent = f"00-{trace_id:032x}-{span_id:016x}-{'01' if sample else '00'}"
    return f"{parent}\n{state}" if state else parent


__all__ = [
    "add_headers",
    "batch",
    "continuing",
    "current",
    "from_headers",
    "handling",
    "mark",
    "mint",
    "root",
    "sample_ratio",
    "sampled",
    "set_sample_ratio",
    "trace_id",
    "within",
]
