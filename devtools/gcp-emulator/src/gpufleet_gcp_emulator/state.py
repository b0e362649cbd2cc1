"""The emulated cloud's state: quotas, instances and their operations, Pub/Sub, sinks, faults.

One lock guards everything; the Compute HTTP server, the gRPC servers and the timers run in
threads and call in here. Instance changes become audit-log entries shaped like Google's
(`protoPayload.methodName`, `resource.labels.instance_id`, `operation.first/last`) and every
sink whose filter selects them publishes them, as JSON, to its Pub/Sub topic.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("gpufleet.gcp_emulator")

LOCAL_SSD_GB = 375

# accelerator type -> (quota metric, NVML name, memory MiB, vCPUs per GPU for a2/a3 shapes)
ACCELERATORS: dict[str, tuple[str, str, int]] = {
    "nvidia-tesla-t4": ("NVIDIA_T4_GPUS", "Tesla T4", 15360),
    "nvidia-tesla-p100": ("NVIDIA_P100_GPUS", "Tesla P100-PCIE-16GB", 16384),
    "nvidia-tesla-v100": ("NVIDIA_V100_GPUS", "Tesla V100-SXM2-16GB", 16384),
    "nvidia-tesla-a100": ("NVIDIA_A100_GPUS", "NVIDIA A100-SXM4-40GB", 40960),
    "nvidia-a100-80gb": ("NVIDIA_A100_80GB_GPUS", "NVIDIA A100-SXM4-80GB", 81920),
    "nvidia-h100-80gb": ("NVIDIA_H100_GPUS", "NVIDIA H100 80GB HBM3", 81559),
}

DEFAULT_QUOTAS: dict[str, float] = {
    "CPUS": 96,
    "LOCAL_SSD_TOTAL_GB": 3000,
    "NVIDIA_T4_GPUS": 4,
    "NVIDIA_P100_GPUS": 2,
    "NVIDIA_V100_GPUS": 4,
    "NVIDIA_A100_GPUS": 2,
    "NVIDIA_A100_80GB_GPUS": 0,
    "NVIDIA_H100_GPUS": 0,
    "INSTANCES": 24,
}


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def machine_cpus(machine_type: str) -> int:
    short = machine_type.rsplit("/", 1)[-1]
    if m := re.fullmatch(r"n1-(?:standard|highmem|highcpu)-(\d+)", short):
        return int(m.group(1))
    if m := re.fullmatch(r"custom-(\d+)-\d+", short):
        return int(m.group(1))
    if m := re.fullmatch(r"a2-(?:highgpu|ultragpu|megagpu)-(\d+)g", short):
        return 12 * int(m.group(1))
    if m := re.fullmatch(r"a3-highgpu-(\d+)g", short):
        return 26 * int(m.group(1))
    return 4


@dataclass
class Faults:
    quota_exhausted: bool = False  # every insert fails with QUOTA_EXCEEDED
    insert_failures: int = 0  # the next N inserts fail (operation error) after starting
    duplicate_log_entries: bool = False  # each entry published twice (new message ids)
    duplicate_deliveries: bool = False  # each Pub/Sub message delivered twice (same id)
    reorder_log_entries: bool = False  # an operation's `last` entry before its `first`


@dataclass
class InstanceRec:
    name: str
    project: str
    zone: str
    id: str
    body: dict[str, Any]
    status: str = "PROVISIONING"
    needs: dict[str, float] = field(default_factory=dict)
    created: str = field(default_factory=now_rfc3339)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def resource(self) -> dict[str, Any]:
        out = dict(self.body)
        out.update(
            kind="compute#instance",
            id=self.id,
            name=self.name,
            status=self.status,
            zone=f"projects/{self.project}/zones/{self.zone}",
            creationTimestamp=self.created,
            selfLink=f"projects/{self.project}/zones/{self.zone}/instances/{self.name}",
        )
        return out


@dataclass
class Message:
    message_id: str
    data: bytes
    attributes: dict[str, str]
    publish_time: float


@dataclass
class Subscription:
    name: str
    topic: str
    ack_deadline_s: int = 10
    pending: deque[tuple[Message, int]] = field(default_factory=deque)  # (msg, attempt)
    outstanding: dict[str, tuple[Message, float, int]] = field(default_factory=dict)


AgentHook = Callable[[InstanceRec, str], None]  # (instance, "start" | "stop" | "kill")


class Cloud:
    def __init__(self, delay_s: float = 0.5, agent_hook: AgentHook | None = None) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.delay_s = delay_s
        self.agent_hook = agent_hook
        self.faults = Faults()
        self.quota_limits: dict[tuple[str, str], dict[str, float]] = {}  # (project, region)
        self.usage: dict[tuple[str, str], dict[str, float]] = {}
        self.instances: dict[tuple[str, str, str], InstanceRec] = {}  # (project, zone, name)
        self.operations: dict[str, dict[str, Any]] = {}
        self.topics: dict[str, dict[str, Any]] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.sinks: dict[str, dict[str, Any]] = {}
        self.log_entries: list[dict[str, Any]] = []  # everything the audit log "wrote"
        self._ids = itertools.count(int(time.time()) * 1000)
        self._held: list[dict[str, Any]] = []

    def next_id(self) -> str:
        return str(next(self._ids))

    # --- quotas -------------------------------------------------------------------------

    def limits(self, project: str, region: str) -> dict[str, float]:
        return self.quota_limits.setdefault((project, region), dict(DEFAULT_QUOTAS))

    def region_resource(self, project: str, region: str) -> dict[str, Any]:
        with self.lock:
            limits = self.limits(project, region)
            used = self.usage.get((project, region), {})
            quotas = [
                {"metric": m, "limit": float(v), "usage": float(used.get(m, 0.0))}
                for m, v in sorted(limits.items())
            ]
        return {
            "kind": "compute#region",
            "id": str(abs(hash(region)) % 10**12),
            "name": region,
            "status": "UP",
            "quotas": quotas,
            "zones": [f"projects/{project}/zones/{region}-{z}" for z in "abcf"],
            "selfLink": f"projects/{project}/regions/{region}",
        }

    def set_quota(self, project: str, region: str, metric: str, limit: float) -> None:
        with self.lock:
            self.limits(project, region)[metric] = float(limit)

    # --- instances ----------------------------------------------------------------------

    def _operation(
        self, project: str, zone: str, kind: str, target: str, target_id: str
    ) -> dict[str, Any]:
        op_id = self.next_id()
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": op_id,
            "name": f"operation-{op_id}",
            "operationType": kind,
            "targetLink": f"projects/{project}/zones/{zone}/instances/{target}",
            "targetId": target_id,
            "status": "RUNNING",
            "progress": 0,
            "zone": f"projects/{project}/zones/{zone}",
            "insertTime": now_rfc3339(),
            "selfLink": f"projects/{project}/zones/{zone}/operations/operation-{op_id}",
        }
        self.operations[op["name"]] = op
        return op

    def _needs(self, body: dict[str, Any]) -> dict[str, float]:
        needs: dict[str, float] = {"INSTANCES": 1.0}
        needs["CPUS"] = float(machine_cpus(str(body.get("machineType", ""))))
        for acc in body.get("guestAccelerators") or []:
            metric = ACCELERATORS.get(str(acc.get("acceleratorType", "")).rsplit("/", 1)[-1])
            if metric is None:
                raise ApiError(400, "invalid", f"Invalid value for field 'acceleratorType': {acc}")
            needs[metric[0]] = needs.get(metric[0], 0.0) + float(acc.get("acceleratorCount", 1))
        ssd = sum(
            1
            for d in body.get("disks") or []
            if d.get("type") == "SCRATCH"
            or "local-ssd" in str((d.get("initializeParams") or {}).get("diskType", ""))
        )
        needs["LOCAL_SSD_TOTAL_GB"] = float(ssd * LOCAL_SSD_GB)
        return needs

    def insert(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("name") or "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise ApiError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'")
        if body.get("guestAccelerators"):
            host = (body.get("scheduling") or {}).get("onHostMaintenance")
            if host != "TERMINATE":
                raise ApiError(
                    400,
                    "badRequest",
                    "Instances with guest accelerators do not support live migration.",
                )
        region = zone.rsplit("-", 1)[0]
        with self.lock:
            if (project, zone, name) in self.instances:
                raise ApiError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                    "already exists",
                )
            needs = self._needs(body)
            limits = self.limits(project, region)
            used = self.usage.setdefault((project, region), {})
            for metric, amount in needs.items():
                if self.faults.quota_exhausted or used.get(metric, 0.0) + amount > limits.get(
                    metric, 0.0
                ):
                    if amount == 0:
                        continue
                    raise ApiError(
                        403,
                        "quotaExceeded",
                        f"Quota '{metric}' exceeded.  Limit: {limits.get(metric, 0.0)} "
                        f"in region {region}.",
                    )
            for metric, amount in needs.items():
                used[metric] = used.get(metric, 0.0) + amount
            rec = InstanceRec(name, project, zone, self.next_id(), body, needs=needs)
            self.instances[(project, zone, name)] = rec
            op = self._operation(project, zone, "insert", name, rec.id)
            fail = self.faults.insert_failures > 0
            if fail:
                self.faults.insert_failures -= 1
            self._audit(rec, "v1.compute.instances.insert", op, first=True)
        threading.Thread(
            target=self._provision, args=(rec, op, fail), daemon=True, name=f"insert-{name}"
        ).start()
        return dict(op)

    def _provision(self, rec: InstanceRec, op: dict[str, Any], fail: bool) -> None:
        time.sleep(self.delay_s)
        with self.lock:
            rec.status = "STAGING"
        time.sleep(self.delay_s)
        with self.lock:
            if (rec.project, rec.zone, rec.name) not in self.instances:
                return
            if fail:
                self._release(rec)
                del self.instances[(rec.project, rec.zone, rec.name)]
                op["error"] = {
                    "errors": [
                        {
                            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                            "message": f"The zone '{rec.zone}' does not have enough "
                            "resources available to fulfill the request.",
                        }
                    ]
                }
                op.update(status="DONE", progress=100, endTime=now_rfc3339())
                op["httpErrorStatusCode"] = 503
                self._audit(
                    rec,
                    "v1.compute.instances.insert",
                    op,
                    last=True,
                    error=(14, op["error"]["errors"][0]["message"]),
                )
                return
            rec.status = "RUNNING"
            op.update(status="DONE", progress=100, endTime=now_rfc3339())
            self._audit(rec, "v1.compute.instances.insert", op, last=True)
        self._hook(rec, "start")

    def _release(self, rec: InstanceRec) -> None:
        used = self.usage.setdefault((rec.project, rec.region), {})
        for metric, amount in rec.needs.items():
            used[metric] = max(0.0, used.get(metric, 0.0) - amount)
        rec.needs = {}

    def get(self, project: str, zone: str, name: str) -> InstanceRec:
        with self.lock:
            rec = self.instances.get((project, zone, name))
            if rec is None:
                raise ApiError(
                    404,
                    "notFound",
                    f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                    "was not found",
                )
            return rec

    def list_instances(self, project: str, zone: str) -> list[InstanceRec]:
        with self.lock:
            return [r for (p, z, _), r in self.instances.items() if p == project and z == zone]

    def delete(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.lock:
            rec = self.get(project, zone, name)
            op = self._operation(project, zone, "delete", name, rec.id)
            self._audit(rec, "v1.compute.instances.delete", op, first=True)
            rec.status = "STOPPING"
        self._hook(rec, "stop")
        threading.Thread(target=self._delete, args=(rec, op), daemon=True).start()
        return dict(op)

    def _delete(self, rec: InstanceRec, op: dict[str, Any]) -> None:
        time.sleep(self.delay_s)
        with self.lock:
            rec.status = "TERMINATED"
        time.sleep(self.delay_s)
        with self.lock:
            self._release(rec)
            self.instances.pop((rec.project, rec.zone, rec.name), None)
            op.update(status="DONE", progress=100, endTime=now_rfc3339())
            self._audit(rec, "v1.compute.instances.delete", op, last=True)

    def stop(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.lock:
            rec = self.get(project, zone, name)
            op = self._operation(project, zone, "stop", name, rec.id)
            self._audit(rec, "v1.compute.instances.stop", op, first=True)
            rec.status = "STOPPING"
        self._hook(rec, "stop")

        def finish() -> None:
            time.sleep(self.delay_s)
            with self.lock:
                rec.status = "TERMINATED"
                op.update(status="DONE", progress=100, endTime=now_rfc3339())
                self._audit(rec, "v1.compute.instances.stop", op, last=True)

        threading.Thread(target=finish, daemon=True).start()
        return dict(op)

    def preempt(self, project: str, zone: str, name: str) -> None:
        """The machine goes away: its agent dies at once, the system-event log says so."""
        with self.lock:
            rec = self.get(project, zone, name)
            rec.status = "TERMINATED"
            op = self._operation(project, zone, "compute.instances.preempted", name, rec.id)
            op.update(status="DONE", progress=100)
            self._audit(rec, "compute.instances.preempted", op, first=True, last=True, system=True)
        self._hook(rec, "kill")

    def _hook(self, rec: InstanceRec, what: str) -> None:
        if self.agent_hook is not None:
            try:
                self.agent_hook(rec, what)
            except Exception:
                log.exception("agent hook %s for %s failed", what, rec.name)

    # --- audit log and sinks ------------------------------------------------------------

    def _audit(
        self,
        rec: InstanceRec,
        method: str,
        op: dict[str, Any],
        *,
        first: bool = False,
        last: bool = False,
        system: bool = False,
        error: tuple[int, str] | None = None,
    ) -> None:
        log_id = "system_event" if system else "activity"
        operation: dict[str, Any] = {"id": op["name"], "producer": "compute.googleapis.com"}
        if first:
            operation["first"] = True
        if last:
            operation["last"] = True
        entry: dict[str, Any] = {
            "insertId": f"{random.getrandbits(40):x}",
            "logName": f"projects/{rec.project}/logs/cloudaudit.googleapis.com%2F{log_id}",
            "protoPayload": {
                "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
                "serviceName": "compute.googleapis.com",
                "methodName": method,
                "resourceName": f"projects/{rec.project}/zones/{rec.zone}/instances/{rec.name}",
                "authenticationInfo": {
                    "principalEmail": "system@google.com"
                    if system
                    else f"gpufleet@{rec.project}.iam.gserviceaccount.com"
                },
                "requestMetadata": {"callerIp": "127.0.0.1"},
            },
            "resource": {
                "type": "gce_instance",
                "labels": {"instance_id": rec.id, "project_id": rec.project, "zone": rec.zone},
            },
            "timestamp": now_rfc3339(),
            "receiveTimestamp": now_rfc3339(),
            "severity": "ERROR" if error else ("INFO" if system else "NOTICE"),
            "operation": operation,
        }
        if error:
            entry["protoPayload"]["status"] = {"code": error[0], "message": error[1]}
        self.log_entries.append(entry)
        if self.faults.reorder_log_entries and first and not last:
            self._held.append(entry)  # published after its operation's last entry
            return
        self._route(entry)
        if last:
            for held in [h for h in self._held if h["operation"]["id"] == op["name"]]:
                self._held.remove(held)
                self._route(held)

    def _route(self, entry: dict[str, Any]) -> None:
        project = entry["resource"]["labels"]["project_id"]
        for sink in self.sinks.values():
            if not sink["name"].startswith(f"projects/{project}/sinks/") or sink.get("disabled"):
                continue
            if not filter_matches(sink.get("filter", ""), entry):
                continue
            topic = str(sink["destination"]).removeprefix("pubsub.googleapis.com/")
            copies = 2 if self.faults.duplicate_log_entries else 1
            for _ in range(copies):
                self.publish(
                    topic,
                    json.dumps(entry).encode(),
                    {"logging.googleapis.com/timestamp": entry["timestamp"]},
                )

    # --- Pub/Sub --------------------------------------------------------------------------

    def publish(self, topic: str, data: bytes, attributes: dict[str, str]) -> str:
        with self.lock:
            if topic not in self.topics:
                raise ApiError(404, "NOT_FOUND", f"Topic not found: {topic}")
            msg = Message(self.next_id(), data, dict(attributes), time.time())
            for sub in self.subscriptions.values():
                if sub.topic == topic:
                    sub.pending.append((msg, 1))
            self.changed.notify_all()
            return msg.message_id

    def pull(self, sub_name: str, max_messages: int) -> list[tuple[str, Message, int]]:
        """Deliver up to `max_messages`: (ack_id, message, delivery attempt)."""
        with self.lock:
            sub = self.subscriptions.get(sub_name)
            if sub is None:
                raise ApiError(404, "NOT_FOUND", f"Subscription does not exist: {sub_name}")
            now = time.time()
            for ack_id, (msg, deadline, attempt) in list(sub.outstanding.items()):
                if deadline <= now:  # not acked in time: redeliver
                    del sub.outstanding[ack_id]
                    sub.pending.appendleft((msg, attempt + 1))
            out: list[tuple[str, Message, int]] = []
            while sub.pending and len(out) < max_messages:
                msg, attempt = sub.pending.popleft()
                copies = 2 if self.faults.duplicate_deliveries else 1
                for _ in range(copies):
                    ack_id = f"{sub.name}:{msg.message_id}:{self.next_id()}"
                    sub.outstanding[ack_id] = (msg, now + sub.ack_deadline_s, attempt)
                    out.append((ack_id, msg, attempt))
            return out

    def ack(self, sub_name: str, ack_ids: list[str]) -> None:
        with self.lock:
            sub = self.subscriptions.get(sub_name)
            if sub is None:
                return
            for ack_id in ack_ids:
                sub.outstanding.pop(ack_id, None)

    def modify_deadline(self, sub_name: str, ack_ids: list[str], seconds: int) -> None:
        with self.lock:
            sub = self.subscriptions.get(sub_name)
            if sub is None:
                return
            for ack_id in ack_ids:
                held = sub.outstanding.get(ack_id)
                if held is None:
                    continue
                if seconds <= 0:  # nack: redeliver now
                    del sub.outstanding[ack_id]
                    sub.pending.appendleft((held[0], held[2] + 1))
                else:
                    sub.outstanding[ack_id] = (held[0], time.time() + seconds, held[2])
            self.changed.notify_all()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "instances": [r.resource() for r in self.instances.values()],
                "sinks": list(self.sinks.values()),
                "topics": sorted(self.topics),
                "subscriptions": {
                    n: {
                        "topic": s.topic,
                        "pending": len(s.pending),
                        "outstanding": len(s.outstanding),
                    }
                    for n, s in self.subscriptions.items()
                },
                "log_entries": len(self.log_entries),
                "faults": self.faults.__dict__,
                "usage": {f"{p}/{r}": u for (p, r), u in self.usage.items()},
            }


_CLAUSE = re.compile(r'resource\.type\s*=\s*"?([a-z_]+)"?')


def filter_matches(filter_: str, entry: dict[str, Any]) -> bool:
    """The subset of the Logging filter language gpufleet's sink uses.

    `resource.type="gce_instance"` must match, and when the filter names methods
    (`protoPayload.methodName:(...)` or `=`), the entry's method must contain one of them.
    """
    m = _CLAUSE.search(filter_)
    if m and entry.get("resource", {}).get("type") != m.group(1):
        return False
    method = str(entry.get("protoPayload", {}).get("methodName", ""))
    if "protoPayload.methodName" in filter_:
        after = filter_.split("protoPayload.methodName", 1)[1]
        names = re.findall(r'"([^"]+)"', after)
        return any(n in method for n in names)
    return True
