"""A durable consumer whose messages are handled a batch at a time (`Batched` in a wiring
table): what a service applies in one transaction, such as the scheduler's worker reports.

It fetches up to `max_batch` messages at once (as many as are there: a fetch returns without
waiting for a full batch; after a batch of several that was not full it waits `linger_s`
before the next fetch, so that a busy stream's messages come in fewer, larger batches,
while messages that come one at a time are each handled at once), checks each
one's envelope and body as every consumer does (deadletter.py: a message that cannot be
valid is dead-lettered and termed, alone), hands the valid ones to the handler in stream
order, and acks them all once it returned. Invalid messages are recorded as they come, the
first REFUSALS_BURST of a subject each minute; past them one record a minute stands for the
rest, with their count (notices.py): a node's own subject is its to fill, the DLQ and the
service's log are not.
If it raises, the batch is handled again **one message at a time**, in order, so that one
message the handler cannot take never holds back (or dead-letters) the others: each that
succeeds is acked, each that fails is nak'ed with the growing delay and, after MAX_DELIVER
attempts, dead-lettered as poison: the same ack policy as one message at a time. So the
handler must be idempotent per message (a redelivered batch may mix old and new messages,
and a failed batch's first messages may be applied twice).

Served on the raw nats-py connection: FastStream hands a pull batch's messages to its
handler one by one (runtime.py), which gives no place to commit them together.

At stop, the fetch under way ends (within its 1 s timeout) and the pull subscription is
given up (`_release`): a fetch that timed out on the client leaves the server's later
`408 Request Timeout` in the subscription's queue, and a lingering pull request may still
deliver a message after the last fetch. Left there, the connection's drain waited for
that queue to be read, which nothing did, for its whole `drain_timeout` (30 s: every
service's stop, and ~30 s per integration test). Now the subscription is unsubscribed at
once, which also makes the server drop the pull requests still pending for this inbox
(nats-server checks a pull request's interest before delivering to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from gpufleet_contracts import Message, field_errors, subjects
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from . import tracing
from .deadletter import (
    INVALID_MESSAGE,
    MAX_DELIVER,
    EnvelopeError,
    check_envelope,
    dead_letter_bytes,
    dead_letter_subject,
    retry_delay,
)
from .notices import Notice, Notices
from .wiring import Batched, Delivery

log = logging.getLogger("gpufleet.bus")
REFUSALS_BURST = 10  # invalid messages of one subject recorded each, a minute


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
        self._psub: Any = None  # nats-py's JetStreamContext.PullSubscription
        self._nc: Client | None = None
        self.refusals = Notices(burst=REFUSALS_BURST)  # per subject

    async def start(self, nc: Client) -> None:
        self._nc = nc
        self._psub = await self._subscribe()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"{self.durable}-batches")

    async def _subscribe(self) -> Any:
        """The pull subscription (its durable consumer made if missing: idempotent)."""
        assert self._nc is not None
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_wait=60,
            max_deliver=-1,
            deliver_policy=DeliverPolicy.ALL,
        )
        return await self._nc.jetstream().pull_subscribe(
            self.subject,
            durable=self.durable,
            stream=self.stream,
            config=config,
            inbox_prefix=self.inbox_prefix,
        )

    async def _resubscribe(self) -> None:
        """A fresh pull subscription after a failed fetch: if the durable consumer is gone
        (a server restarted without it, an operator deleted it), every fetch of the old one
        fails for good, and subscribing again makes the consumer anew. Until the server
        answers, the old one is kept and this is tried again after the next failure."""
        try:
            fresh = await self._subscribe()
        except Exception as exc:
            log.warning("%s: cannot subscribe again yet: %s", self.durable, exc)
            return
        old, self._psub = self._psub, fresh
        with contextlib.suppress(Exception):
            await old.unsubscribe()
        log.info("%s: pull subscription made again", self.durable)

    async def stop(self, grace_s: float = 10.0) -> None:
        """The batch in hand is applied and acked (within `grace_s`); no other is fetched;
        the subscription is given up (`_release`)."""
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
        psub, self._psub = self._psub, None
        if psub is not None:
            await self._release(psub)

    async def _release(self, psub: Any) -> None:
        """Unsubscribe at once, so that the connection's drain finds nothing left to wait
        for (the server then drops this inbox's pull requests that still linger). Not the
        subscription's own drain: nats-py's fetch takes discarded status messages off the
        queue without marking them done, so that drain would wait for ever. A message a
        lingering pull request delivered after the last fetch is not acked: the server
        delivers it again after `ack_wait`, to whoever consumes next."""
        try:
            await psub.unsubscribe()
        except Exception as exc:  # a closed connection has nothing left to drain
            log.warning("%s: releasing the pull subscription failed: %s", self.durable, exc)

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msgs: list[Msg] = await self._psub.fetch(self.spec.max_batch, timeout=1.0)
            except (NatsTimeout, TimeoutError):
                continue
            except Exception as exc:  # the connection reconnects; subscribe again, try again
                log.warning("%s: fetch failed: %s", self.durable, exc)
                await asyncio.sleep(0.5)
                await self._resubscribe()
                continue
            try:
                await self._handle(msgs)
            except Exception:
                log.exception("%s: batch of %d not handled", self.durable, len(msgs))
            if self.spec.linger_s > 0 and 1 < len(msgs) < self.spec.max_batch:
                with contextlib.suppress(TimeoutError):  # a stop ends the wait
                    await asyncio.wait_for(self._stop.wait(), self.spec.linger_s)

    async def _handle(self, msgs: list[Msg]) -> None:
        for notice in self.refusals.due():  # a flood that stopped: its count, in the log
            log.warning("%s invalid message(s) on %s not recorded", notice.text(), notice.key)
        valid: list[tuple[Msg, tuple[Message, Delivery]]] = []
        for msg in msgs:
            decoded = await self._decode(msg)
            if decoded is not None:
                valid.append((msg, decoded))
        if not valid:
            return
        items = [item for _, item in valid]
        try:
            with tracing.batch([d.trace for _, d in items], self.subject, [d.id for _, d in items]):
                await self.spec.handler(items)
        except Exception as exc:
            if len(valid) == 1:
                await self._retry([valid[0][0]], exc)
                return
            log.warning("%s: batch of %d failed (%s); one at a time", self.durable, len(valid), exc)
            for msg, item in valid:
                try:
                    await self.spec.handler([item])
                except Exception as one:
                    await self._retry([msg], one)
                else:
                    await msg.ack()
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
        trace = tracing.from_headers(headers)
        return body, Delivery(msg.subject, stamp, str(headers["ce-id"]), trace)

    async def _refuse(self, msg: Msg, message: str, errors: list[dict[str, Any]]) -> None:
        notice = self.refusals.note(msg.subject)
        if notice is not None:
            log.warning(
                "rejected invalid message: %s%s",
                message,
                "" if notice.count == 1 else f" ({notice.text()} on its subject)",
                extra={"subject": msg.subject},
            )
            await self._dead_letter(msg, "invalid", errors, notice)
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

    async def _dead_letter(
        self, msg: Msg, reason: str, errors: list[dict[str, Any]], notice: Notice | None = None
    ) -> None:
        assert self._nc is not None
        record = dead_letter_bytes(self.service, msg.subject, msg.data, msg.headers, reason, errors)
        if notice is not None and notice.count > 1:  # it stands for these many
            record = json.dumps({**json.loads(record), "count": notice.count}).encode()
        await self._nc.jetstream().publish(
            dead_letter_subject(self.service, msg.subject),
            record,
            stream=subjects.STREAM_DLQ,
            timeout=5.0,
        )
