"""The adapter to Google Cloud: Compute (quotas, instances), Logging (the sink), Pub/Sub.

This is the code that runs against Google; tests run it, unchanged, against the project's
emulator (`gpufleet_gcp_emulator`). Settings choose the endpoints (ProvisionerSettings):

- Google (default): the service account's credentials, Google's endpoints.
- Emulator: `GPUFLEET_GCP_COMPUTE_ENDPOINT=http://127.0.0.1:P` (google-cloud-compute's REST
  transport takes an `http://` api_endpoint as is) and `GPUFLEET_GCP_GRPC_ENDPOINT=host:port`
  (or `PUBSUB_EMULATOR_HOST`) for Pub/Sub and Logging over an insecure gRPC channel, with
  anonymous credentials.

Every call is blocking (the client libraries are synchronous); the service calls them in a
thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1, pubsub_v1  # type: ignore[attr-defined]
from google.cloud.logging_v2.services.config_service_v2 import ConfigServiceV2Client
from google.cloud.logging_v2.services.config_service_v2.transports import (
    ConfigServiceV2GrpcTransport,
)
from google.cloud.logging_v2.types import LogSink
from google.oauth2 import service_account
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from .keys import ServiceAccountKey
from .quota import GcpGpuType, Quota

log = logging.getLogger("gpufleet.provisioner.gcp")

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
LIFECYCLE = "gpufleet-node-lifecycle"  # topic and sink name
SUBSCRIPTION = "gpufleet-node-lifecycle-provisioner"
# The audit-log entries of instance changes gpufleet follows (R-NODE-5).
SINK_FILTER = (
    'resource.type="gce_instance" AND logName:"cloudaudit.googleapis.com" AND '
    'protoPayload.methodName:("compute.instances.insert" OR "compute.instances.delete" OR '
    '"compute.instances.stop" OR "compute.instances.preempted")'
)
BOOT_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"


class GcpError(Exception):
    """A Google Cloud call failed; `code` is short ("quota_exceeded", "not_found", ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class GcpEndpoints:
    compute: str | None = None
    grpc: str | None = None

    @property
    def emulated(self) -> bool:
        return bool(self.compute or self.grpc)


def label_value(text: str) -> str:
    """A GCE label value: lowercase letters, digits, '-' and '_', at most 63."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def _error(exc: Exception) -> GcpError:
    text = str(exc)
    if isinstance(exc, gexc.NotFound):
        return GcpError("not_found", text)
    if isinstance(exc, gexc.AlreadyExists | gexc.Conflict):
        return GcpError("already_exists", text)
    if "quota" in text.lower():
        return GcpError("quota_exceeded", text)
    if isinstance(exc, gexc.Forbidden | gexc.PermissionDenied):
        return GcpError("permission_denied", text)
    return GcpError("gcp_error", text)


class GcpProject:
    """One account's Google Cloud project, through the official client libraries."""

    def __init__(self, key: ServiceAccountKey, endpoints: GcpEndpoints) -> None:
        self.project = key.project_id
        self.endpoints = endpoints
        creds: Credentials
        if endpoints.emulated:
            creds = AnonymousCredentials()  # type: ignore[no-untyped-call]
        else:
            creds = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
                key.info, scopes=SCOPES
            )
        opts: dict[str, Any] = {"api_endpoint": endpoints.compute} if endpoints.compute else {}
        self.regions = compute_v1.RegionsClient(credentials=creds, client_options=opts)
        self.instances = compute_v1.InstancesClient(credentials=creds, client_options=opts)
        self.zone_ops = compute_v1.ZoneOperationsClient(credentials=creds, client_options=opts)
        if endpoints.grpc:
            host = endpoints.grpc
            self.publisher = pubsub_v1.PublisherClient(
                transport=PublisherGrpcTransport(channel=grpc.insecure_channel(host))
            )
            self.subscriber = pubsub_v1.SubscriberClient(
                transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(host))
            )
            self.config = ConfigServiceV2Client(
                transport=ConfigServiceV2GrpcTransport(channel=grpc.insecure_channel(host))
            )
        else:
            self.publisher = pubsub_v1.PublisherClient(credentials=creds)
            self.subscriber = pubsub_v1.SubscriberClient(credentials=creds)
            self.config = ConfigServiceV2Client(credentials=creds)

    # --- Compute ----------------------------------------------------------------------------

    def region_quotas(self, region: str) -> dict[str, Quota]:
        try:
            r = self.regions.get(project=self.project, region=region)
        except gexc.GoogleAPICallError as exc:
            raise _error(exc) from exc
        return {q.metric: Quota(q.metric, float(q.limit), float(q.usage)) for q in r.quotas}

    def instance_body(
        self,
        zone: str,
        name: str,
        gpu: GcpGpuType,
        gpus: int,
        labels: dict[str, str],
        metadata: dict[str, str],
    ) -> compute_v1.Instance:
        return compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{gpu.machine_for(gpus)}",
            guest_accelerators=[
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{gpu.accelerator}",
                    accelerator_count=gpus,
                )
            ],
            # GPUs cannot live-migrate: the host's maintenance stops the instance.
            scheduling=compute_v1.Scheduling(
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
                provisioning_model="STANDARD",
            ),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=BOOT_IMAGE, disk_size_gb=100
                    ),
                ),
                compute_v1.AttachedDisk(
                    type_="SCRATCH",
                    interface="NVME",
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        disk_type=f"zones/{zone}/diskTypes/local-ssd"
                    ),
                ),
            ],
            network_interfaces=[
                compute_v1.NetworkInterface(
                    network="global/networks/default",
                    access_configs=[
                        compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
                    ],
                )
            ],
            labels={k: label_value(v) for k, v in labels.items()},
            metadata=compute_v1.Metadata(
                items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]
            ),
        )

    def insert_instance(self, zone: str, body: compute_v1.Instance) -> str:
        """Start creating the instance; returns the operation name. Raises GcpError."""
        try:
            op = self.instances.insert_unary(
                project=self.project, zone=zone, instance_resource=body
            )
        except gexc.GoogleAPICallError as exc:
            raise _error(exc) from exc
        if op.error and op.error.errors:
            first = op.error.errors[0]
            code = "quota_exceeded" if "QUOTA" in first.code else first.code.lower()
            raise GcpError(code, first.message)
        return str(op.name)

    def delete_instance(self, zone: str, name: str) -> bool:
        """Start deleting; False when the instance does not exist (already gone)."""
        try:
            self.instances.delete_unary(project=self.project, zone=zone, instance=name)
        except gexc.NotFound:
            return False
        except gexc.GoogleAPICallError as exc:
            raise _error(exc) from exc
        return True

    def get_instance(self, zone: str, name: str) -> compute_v1.Instance | None:
        try:
            return self.instances.get(project=self.project, zone=zone, instance=name)
        except gexc.NotFound:
            return None
        except gexc.GoogleAPICallError as exc:
            raise _error(exc) from exc

    def list_instances(self, zone: str) -> list[compute_v1.Instance]:
        try:
            return list(self.instances.list(project=self.project, zone=zone))
        except gexc.GoogleAPICallError as exc:
            raise _error(exc) from exc

    # --- Logging sink -> Pub/Sub ------------------------------------------------------------

    @property
    def topic_path(self) -> str:
        return f"projects/{self.project}/topics/{LIFECYCLE}"

    @property
    def subscription_path(self) -> str:
        return f"projects/{self.project}/subscriptions/{SUBSCRIPTION}"

    def ensure_lifecycle(self) -> dict[str, str]:
        """Topic, sink and subscription, each created unless it exists (idempotent).

        Returns what an operator must know: the sink's writer identity needs
        roles/pubsub.publisher on the topic.
        """
        try:
            with contextlib.suppress(gexc.AlreadyExists):
                self.publisher.create_topic(request={"name": self.topic_path})
            sink_name = f"projects/{self.project}/sinks/{LIFECYCLE}"
            destination = f"pubsub.googleapis.com/{self.topic_path}"
            try:
                sink = self.config.get_sink(sink_name=sink_name)
                if sink.filter != SINK_FILTER or sink.destination != destination:
                    sink = self.config.update_sink(
                        sink_name=sink_name,
                        sink=LogSink(name=LIFECYCLE, destination=destination, filter=SINK_FILTER),
                    )
            except gexc.NotFound:
                sink = self.config.create_sink(
                    request={
                        "parent": f"projects/{self.project}",
                        "sink": LogSink(
                            name=LIFECYCLE, destination=destination, filter=SINK_FILTER
                        ),
                        "unique_writer_identity": True,
                    }
                )
            with contextlib.suppress(gexc.AlreadyExists):
                self.subscriber.create_subscription(
                    request={
                        "name": self.subscription_path,
                        "topic": self.topic_path,
                        "ack_deadline_seconds": 30,
                    }
                )
        except gexc.GoogleAPICallError as exc:
            raise _error(exc) from exc
        return {
            "topic": self.topic_path,
            "subscription": self.subscription_path,
            "sink": sink_name,
            "sink_filter": SINK_FILTER,
            "writer_identity": str(sink.writer_identity),
        }
