"""Publishing a gpufleet message: JSON body, CloudEvents headers, JetStream ack awaited."""

from __future__ import annotations

from typing import Protocol

from gpufleet_contracts import Envelope, Message, envelope_for

from . import tracing
from .streams import stream_for


class Publisher(Protocol):
    async def publish(
        self,
        message: bytes,
        subject: str,
        *,
        headers: dict[str, str] | None = ...,
        stream: str | None = ...,
        timeout: float | None = ...,  # noqa: ASYNC109
    ) -> object: ...


async def publish_raw(
    broker: Publisher,
    subject: str,
    payload: bytes,
    *,
    type_: str,
    source: str,
    msg_id: str,
    trace: str | None = None,
) -> None:
    """Publish bytes; to JetStream (waiting for its ack) when a stream holds the subject.
    `trace`: the trace it continues (default: the current one, tracing.py)."""
    env = Envelope(type=type_, source=source, subject=subject, id=msg_id)
    headers = tracing.add_headers(env.headers(), trace)
    await broker.publish(payload, subject, headers=headers, stream=stream_for(subject), timeout=5.0)


async def publish(
    broker: Publisher,
    msg: Message,
    *,
    source: str,
    msg_id: str | None = None,
    trace: str | None = None,
) -> str:
    env = envelope_for(msg, source=source, id=msg_id)
    await broker.publish(
        msg.to_bytes(),
        env.subject,
        headers=tracing.add_headers(env.headers(), trace),
        stream=stream_for(env.subject),
        timeout=5.0,
    )
    return env.id


def emit(
    tx: object,
    msg: Message,
    msg_id: str | None = None,
    *,
    sealed: bool = False,
    subject: str | None = None,
    trace: str | None = None,
) -> str:
    """Queue `msg` in a store transaction's outbox (see gpufleet_store.Transaction.emit);
    `sealed`: it carries a secret, and is stored encrypted until the relay publishes it;
    `subject`: another than its own (the scheduler's `kept` worker facts); `trace`: the
    trace it continues (default: the current one, tracing.py), carried in its headers."""
    from gpufleet_store import Transaction

    assert isinstance(tx, Transaction)
    return tx.emit(
        subject or msg.subject(),
        msg.TYPE,
        msg.to_bytes(),
        msg_id,
        sealed=sealed,
        trace=trace or tracing.current(),
    )
