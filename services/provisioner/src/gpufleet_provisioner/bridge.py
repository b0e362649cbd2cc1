"""Pub/Sub -> NATS: the node-lifecycle subscription of one GCP project, into JetStream.

google-cloud-pubsub's streaming pull runs the callback in its own threads; each message is
handed to the service's asyncio loop, published to JetStream with `Nats-Msg-Id` derived from
the Pub/Sub message id (`gcp:<project>:<message id>`: a redelivered message is stored once),
and acknowledged to Pub/Sub only after JetStream's PubAck. A failed publish nacks (Pub/Sub
redelivers); an entry that is not an instance's is acknowledged and logged, never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from google.cloud import pubsub_v1  # type: ignore[attr-defined]
from gpufleet_bus import publish
from gpufleet_bus.publish import Publisher

from .gcp import GcpProject
from .lifecycle import parse_entry

log = logging.getLogger("gpufleet.provisioner.bridge")

SOURCE = "gpufleet/provisioner/gcp-bridge"
PUBLISH_TIMEOUT_S = 15.0


def nats_msg_id(project: str, message_id: str) -> str:
    return f"gcp:{project}:{message_id}"


class LifecycleBridge:
    def __init__(
        self, project: GcpProject, broker: Publisher, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.project = project
        self.broker = broker
        self.loop = loop
        self.future: Any = None
        self.bridged = 0

    def start(self) -> None:
        self.future = self.project.subscriber.subscribe(
            self.project.subscription_path,
            callback=self._on_message,
            flow_control=pubsub_v1.types.FlowControl(max_messages=64),
        )
        log.info("bridging %s to NATS", self.project.subscription_path)

    def _on_message(self, message: Any) -> None:  # a Pub/Sub thread
        evt = parse_entry(message.data, message.message_id)
        if evt is None:
            log.warning(
                "ignored a log entry that is not an instance's (msg %s)", message.message_id
            )
            message.ack()
            return
        msg_id = nats_msg_id(self.project.project, message.message_id)
        fut = asyncio.run_coroutine_threadsafe(
            publish(self.broker, evt, source=SOURCE, msg_id=msg_id), self.loop
        )
        try:
            fut.result(timeout=PUBLISH_TIMEOUT_S)
        except Exception as exc:
            log.warning("not stored in JetStream, Pub/Sub will redeliver %s: %s", msg_id, exc)
            message.nack()
            return
        message.ack()  # only now: JetStream has it
        self.bridged += 1
        log.info("instance %s %s (%s) bridged as %s", evt.instance, evt.action, evt.phase, msg_id)

    def stop(self) -> None:
        if self.future is not None:
            self.future.cancel()
            with contextlib.suppress(Exception):
                self.future.result(timeout=5)
            self.future = None
