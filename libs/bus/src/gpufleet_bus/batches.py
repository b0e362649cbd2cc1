"""A durable consumer whose messages are handled a batch at a time (`Batched` in a wiring
table): what a service applies in one transaction, such as the scheduler's worker reports.

It fetches up to `max_batch` messages at once (as many as are there: a fetch returns
without waiting for a full batch), checks each one's envelope and body as every consumer
does (deadletter.py: a message that cannot be valid is dead-lettered and termed, alone),
hands the valid ones to the handler in stream order, and acks them all once it returned.
If it raises, each is nak'ed with the growing delay and, after MAX_DELIVER attempts,
dead-lettered as poison: the same ack policy as one message at a time, so the handler must
be idempotent per message (a redelivered batch may mix old and new messages).

Served on the raw nats-py connection: FastStream hands a pull batch's messages to its
handler one by one (runtime.py), which gives no place to commit them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from gpufleet_contracts import Message, field_errors, subjects
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from .deadletter import (
    INVALID_MESSAGE,
    MAX_DELIVER,
    EnvelopeError,
    check_envelope,
    dead_letter_bytes,
    dead_letter_subject,
    retry_delay,
)
from .wiring import Batched, Delivery

log = logging.getLogger("gpufleet.bus")


class BatchConsumer:
    def __init__(
        self,
        service: str,
        durable: str,
        stream: str,
        subject: str,
        spec: Batched,
        inbox_prefix: bytes,
    ) -> None:
        self.service = service
        self.durable = durable
        self.stream = stream
        self.subject = subject
        self.spec = spec
        self.inbox_prefix = inbox_prefix
        self.by_type: Mapping[str, type[Message]] = {m.TYPE: m for m in spec.types}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._nc: Client | None = None

    async def start(self, nc: Client) -> None:
        self._nc = nc
        js = nc.jetstream()
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_wait=60,
            max_deliver=-1,
            deliver_policy=DeliverPolicy.ALL,
        )
        psub = await js.pull_subscribe(
            self.subject,
            durable=self.durable,
            stream=self.stream,
            config=config,
            inbox_prefix=self.inbox_prefix,
        )
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(psub), name=f"{self.durable}-batches")

    async def stop(self, grace_s: float = 10.0) -> None:
        """The batch in hand is applied and acked (within `grace_s`); no other is fetched."""
        self._stop.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=grace_s)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, psub: Any) -> None:
        while not self._stop.is_set():
            try:
                msgs: list[Msg] = await psub.fetch(self.spec.max_batch, timeout=1.0)
            except (NatsTimeout, TimeoutError):
                continue
            except Exception as exc:  # the connection reconnects; try again
                log.warning("%s: fetch failed: %s", self.durable, exc)
                await asyncio.sleep(0.5)
                continue
            try:
                await self._handle(msgs)
            except Exception:
                log.exception("%s: batch of %d not handled", self.durable, len(msgs))

    async def _handle(self, msgs: list[Msg]) -> None:
        valid: list[tuple[Msg, tuple[Message, Delivery]]] = []
        for msg in msgs:
            decoded = await self._decode(msg)
            if decoded is not None:
                valid.append((msg, decoded))
        if not valid:
            return
        try:
            await self.spec.handler([item for _, item in valid])
        except Exception as exc:
            await self._retry([m for m, _ in valid], exc)
            return
        for msg, _ in valid:
            await msg.ack()

    async def _decode(self, msg: Msg) -> tuple[Message, Delivery] | None:
        """The message and where it came from, or None: dead-lettered and termed."""
        headers = msg.headers or {}
        try:
            check_envelope(headers, sorted(self.by_type))
            model = self.by_type[str(headers["ce-type"])]
            body = model.model_validate_json(msg.data)
        except EnvelopeError as exc:
            await self._refuse(msg, str(exc), exc.errors())
            return None
        except ValidationError as exc:  # not JSON, or not this model
            await self._refuse(msg, INVALID_MESSAGE, [e.model_dump() for e in field_errors(exc)])
            return None
        stamp = msg.metadata.timestamp
        return body, Delivery(msg.subject, stamp, str(headers["ce-id"]))

    async def _refuse(self, msg: Msg, message: str, errors: list[dict[str, Any]]) -> None:
        log.warning("rejected invalid message: %s", message, extra={"subject": msg.subject})
        await self._dead_letter(msg, "invalid", errors)
        await msg.term()

    async def _retry(self, msgs: list[Msg], exc: Exception) -> None:
        for msg in msgs:
            attempt = int(msg.metadata.num_delivered)
            if attempt >= MAX_DELIVER:
                log.error("poison message after %d attempts: %s", attempt, exc)
                await self._dead_letter(msg, "poison", [{"error": f"{type(exc).__name__}: {exc}"}])
                await msg.term()
                continue
            delay = retry_delay(attempt)
            log.warning(
                "batch handler failed (attempt %d), retrying in %.1fs: %s", attempt, delay, exc
            )
            await msg.nak(delay=delay)

    async def _dead_letter(self, msg: Msg, reason: str, errors: list[dict[str, Any]]) -> None:
        assert self._nc is not None
        record = dead_letter_bytes(self.service, msg.subject, msg.data, msg.headers, reason, errors)
        await self._nc.jetstream().publish(
            dead_letter_subject(self.service, msg.subject),
            record,
            stream=subjects.STREAM_DLQ,
            timeout=5.0,
        )
