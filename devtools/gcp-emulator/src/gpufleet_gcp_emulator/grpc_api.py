"""Pub/Sub (Publisher, Subscriber) and Logging (ConfigServiceV2 sinks) over gRPC.

The request and response messages are the real APIs' protobufs (from google-cloud-pubsub and
google-cloud-logging), registered with generic handlers, so the real client libraries talk to
this server unchanged: `PUBSUB_EMULATOR_HOST=127.0.0.1:<port>` for Pub/Sub, an insecure
channel to the same address for Logging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.cloud.logging_v2.types import logging_config as lc
from google.protobuf import empty_pb2, timestamp_pb2
from google.pubsub_v1.types import pubsub as ps

from .state import ApiError, Cloud, Subscription

_CODES = {404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ALREADY_EXISTS}


def _pb(t: Any) -> Any:
    return t.pb()


def _unary(fn: Callable[[Any, grpc.ServicerContext], Any], req: Any, resp: Any) -> Any:
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(request, context)
        except ApiError as err:
            context.abort(_CODES.get(err.status, grpc.StatusCode.INVALID_ARGUMENT), err.message)

    return grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
    )


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


class PubSub:
    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    # Publisher
    def create_topic(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            if req.name in self.cloud.topics:
                raise ApiError(409, "ALREADY_EXISTS", "Topic already exists")
            self.cloud.topics[req.name] = {"name": req.name, "labels": dict(req.labels)}
        return req

    def get_topic(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            if req.topic not in self.cloud.topics:
                raise ApiError(404, "NOT_FOUND", "Topic not found")
        return _pb(ps.Topic)(name=req.topic)

    def publish(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        ids = [self.cloud.publish(req.topic, m.data, dict(m.attributes)) for m in req.messages]
        return _pb(ps.PublishResponse)(message_ids=ids)

    def delete_topic(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            self.cloud.topics.pop(req.topic, None)
        return empty_pb2.Empty()

    # Subscriber
    def create_subscription(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            if req.name in self.cloud.subscriptions:
                raise ApiError(409, "ALREADY_EXISTS", "Subscription already exists")
            if req.topic not in self.cloud.topics:
                raise ApiError(404, "NOT_FOUND", "Topic not found")
            deadline = req.ack_deadline_seconds or 10
            self.cloud.subscriptions[req.name] = Subscription(req.name, req.topic, deadline)
            out = _pb(ps.Subscription)()
            out.CopyFrom(req)
            out.ack_deadline_seconds = deadline
            return out

    def get_subscription(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            sub = self.cloud.subscriptions.get(req.subscription)
            if sub is None:
                raise ApiError(404, "NOT_FOUND", "Subscription does not exist")
            return _pb(ps.Subscription)(
                name=sub.name, topic=sub.topic, ack_deadline_seconds=sub.ack_deadline_s
            )

    def delete_subscription(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            self.cloud.subscriptions.pop(req.subscription, None)
        return empty_pb2.Empty()

    def acknowledge(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        self.cloud.ack(req.subscription, list(req.ack_ids))
        return empty_pb2.Empty()

    def modify_ack_deadline(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        self.cloud.modify_deadline(
            req.subscription, list(req.ack_ids), int(req.ack_deadline_seconds)
        )
        return empty_pb2.Empty()

    def _received(self, batch: list[Any]) -> list[Any]:
        out = []
        for ack_id, msg, attempt in batch:
            m = _pb(ps.PubsubMessage)(
                data=msg.data,
                attributes=msg.attributes,
                message_id=msg.message_id,
                publish_time=_ts(msg.publish_time),
            )
            out.append(_pb(ps.ReceivedMessage)(ack_id=ack_id, message=m, delivery_attempt=attempt))
        return out

    def pull(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        batch = self.cloud.pull(req.subscription, req.max_messages or 100)
        return _pb(ps.PullResponse)(received_messages=self._received(batch))

    def streaming_pull(self, requests: Iterator[Any], ctx: grpc.ServicerContext) -> Iterator[Any]:
        try:
            first = next(requests)
        except StopIteration:
            return
        sub_name = first.subscription
        with self.cloud.lock:
            if sub_name not in self.cloud.subscriptions:
                ctx.abort(grpc.StatusCode.NOT_FOUND, "Subscription does not exist")
        self._apply(sub_name, first)
        closed = threading.Event()

        def read_rest() -> None:
            try:
                for req in requests:
                    self._apply(sub_name, req)
            except grpc.RpcError:
                pass
            finally:
                closed.set()

        threading.Thread(target=read_rest, daemon=True).start()
        limit = first.max_outstanding_messages or 1000
        while ctx.is_active() and not closed.is_set():
            try:
                batch = self.cloud.pull(sub_name, limit)
            except ApiError:
                return
            if batch:
                yield _pb(ps.StreamingPullResponse)(received_messages=self._received(batch))
                continue
            with self.cloud.changed:
                self.cloud.changed.wait(timeout=0.2)

    def _apply(self, sub_name: str, req: Any) -> None:
        if req.ack_ids:
            self.cloud.ack(sub_name, list(req.ack_ids))
        for ack_id, seconds in zip(
            req.modify_deadline_ack_ids, req.modify_deadline_seconds, strict=False
        ):
            self.cloud.modify_deadline(sub_name, [ack_id], int(seconds))
        if req.stream_ack_deadline_seconds:
            with self.cloud.lock:
                sub = self.cloud.subscriptions.get(sub_name)
                if sub is not None:
                    sub.ack_deadline_s = req.stream_ack_deadline_seconds

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        publisher = {
            "CreateTopic": _unary(self.create_topic, _pb(ps.Topic), _pb(ps.Topic)),
            "GetTopic": _unary(self.get_topic, _pb(ps.GetTopicRequest), _pb(ps.Topic)),
            "Publish": _unary(self.publish, _pb(ps.PublishRequest), _pb(ps.PublishResponse)),
            "DeleteTopic": _unary(self.delete_topic, _pb(ps.DeleteTopicRequest), empty_pb2.Empty),
        }
        subscriber = {
            "CreateSubscription": _unary(
                self.create_subscription, _pb(ps.Subscription), _pb(ps.Subscription)
            ),
            "GetSubscription": _unary(
                self.get_subscription, _pb(ps.GetSubscriptionRequest), _pb(ps.Subscription)
            ),
            "DeleteSubscription": _unary(
                self.delete_subscription, _pb(ps.DeleteSubscriptionRequest), empty_pb2.Empty
            ),
            "Acknowledge": _unary(self.acknowledge, _pb(ps.AcknowledgeRequest), empty_pb2.Empty),
            "ModifyAckDeadline": _unary(
                self.modify_ack_deadline, _pb(ps.ModifyAckDeadlineRequest), empty_pb2.Empty
            ),
            "Pull": _unary(self.pull, _pb(ps.PullRequest), _pb(ps.PullResponse)),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                self.streaming_pull,
                request_deserializer=_pb(ps.StreamingPullRequest).FromString,
                response_serializer=_pb(ps.StreamingPullResponse).SerializeToString,
            ),
        }
        return [
            grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
            grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber),
        ]


class Sinks:
    """ConfigServiceV2: the sinks of a project. The writer identity is Logging's own."""

    WRITER = "serviceAccount:cloud-logs@system.gserviceaccount.com"

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    def _out(self, doc: dict[str, Any]) -> Any:
        return _pb(lc.LogSink)(
            name=doc["name"].rsplit("/", 1)[-1],
            destination=doc["destination"],
            filter=doc["filter"],
            writer_identity=doc["writer_identity"],
            disabled=doc.get("disabled", False),
        )

    def create_sink(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        full = f"{req.parent}/sinks/{req.sink.name}"
        with self.cloud.lock:
            if full in self.cloud.sinks:
                raise ApiError(409, "ALREADY_EXISTS", f"Sink {req.sink.name} already exists")
            doc = {
                "name": full,
                "destination": req.sink.destination,
                "filter": req.sink.filter,
                "writer_identity": self.WRITER,
                "disabled": req.sink.disabled,
                "created": time.time(),
            }
            self.cloud.sinks[full] = doc
        return self._out(doc)

    def get_sink(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            doc = self.cloud.sinks.get(req.sink_name)
            if doc is None:
                raise ApiError(404, "NOT_FOUND", f"Sink {req.sink_name} does not exist")
            return self._out(doc)

    def update_sink(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            doc = self.cloud.sinks.get(req.sink_name)
            if doc is None:
                raise ApiError(404, "NOT_FOUND", f"Sink {req.sink_name} does not exist")
            doc.update(destination=req.sink.destination, filter=req.sink.filter)
            return self._out(doc)

    def delete_sink(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        with self.cloud.lock:
            self.cloud.sinks.pop(req.sink_name, None)
        return empty_pb2.Empty()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        methods = {
            "CreateSink": _unary(self.create_sink, _pb(lc.CreateSinkRequest), _pb(lc.LogSink)),
            "GetSink": _unary(self.get_sink, _pb(lc.GetSinkRequest), _pb(lc.LogSink)),
            "UpdateSink": _unary(self.update_sink, _pb(lc.UpdateSinkRequest), _pb(lc.LogSink)),
            "DeleteSink": _unary(self.delete_sink, _pb(lc.DeleteSinkRequest), empty_pb2.Empty),
        }
        return [grpc.method_handlers_generic_handler("google.logging.v2.ConfigServiceV2", methods)]


def serve_grpc(cloud: Cloud, host: str, port: int) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    for handler in [*PubSub(cloud).handlers(), *Sinks(cloud).handlers()]:
        server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, bound
