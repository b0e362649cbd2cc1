"""What an account is shown of its devices, configurations and rollouts: contract models
made from stored documents (never a document itself)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet_contracts.devices import (
    DeployState,
    DeviceConfigKeys,
    DeviceConfigSpec,
    DeviceConfigsTold,
    DeviceConfigView,
    DevicePresence,
    DeviceState,
    DeviceTelemetry,
    DeviceView,
    RolloutDeviceView,
    RolloutPhase,
    RolloutPolicy,
    RolloutView,
)
from gpufleet_store import Doc, from_ms, now_ms

from .presence import presence
from .rollout import Rollout, Target


def configs_told(doc: Doc) -> DeviceConfigsTold:
    """The configurations a device was told to run: its current deployment's (`pending`) and
    the last one it ran to `running` (`last_good`, what a revert goes back to); the keys
    and checkpoints of no other configuration are the device's to have."""
    told = []
    for kept in (doc.get("pending"), doc.get("last_good")):
        spec = (kept or {}).get("spec")
        if spec:
            s = DeviceConfigSpec.model_validate(spec)
            told.append(DeviceConfigKeys(image=s.image, keys=s.keys, checkpoints=s.checkpoints))
    return DeviceConfigsTold(minion_id=doc["minion_id"], owner=doc["owner"], configs=told)


def device_view(doc: Doc, now: datetime) -> DeviceView:
    """`now` tells whether it is online (its last heartbeat's age)."""
    last_seen = from_ms(doc.get("last_seen_ms"))
    telemetry = doc.get("telemetry")
    return DeviceView(
        device_id=doc["_id"],
        name=doc["name"],
        minion_id=doc["minion_id"],
        region=doc["region"],
        model=doc["model"],
        state=doc["state"],
        config=doc.get("config"),
        deploy_state=doc.get("deploy_state") or DeployState.idle,
        deploy_reason=doc.get("deploy_reason"),
        deployment_id=doc.get("deployment_id"),
        inference=doc.get("inference"),
        deployed_at=from_ms(doc.get("deployed_at_ms")),
        presence=(
            DevicePresence.offline
            if doc["state"] == DeviceState.removed.value
            else presence(last_seen, doc.get("heartbeat_s"), now)
        ),
        last_seen=last_seen,
        telemetry=DeviceTelemetry.model_validate(telemetry) if telemetry else None,
        added_at=at(doc["added_at_ms"]),
        removed_at=from_ms(doc.get("removed_at_ms")),
    )


def config_spec(doc: Doc) -> DeviceConfigSpec:
    return DeviceConfigSpec.model_validate(doc["spec"])


def config_view(doc: Doc, devices: int = 0) -> DeviceConfigView:
    return DeviceConfigView(
        **config_spec(doc).model_dump(),
        region=doc["region"],
        name=doc["name"],
        created_at=at(doc["created_at_ms"]),
        devices=devices,
    )


def rollout_doc(r: Rollout) -> Doc:
    """The state machine's value as stored (everything but the rollout's own fields)."""
    return {
        "policy": r.policy.model_dump(),
        "phase": r.phase.value,
        "wave": r.wave,
        "reason": r.reason,
        "finished_at_ms": _ms(r.finished_at),
        "targets": [
            {
                "device_id": t.device_id,
                "wave": t.wave,
                "state": t.state.value,
                "reason": t.reason,
                "told_at_ms": _ms(t.told_at),
                "updated_at_ms": _ms(t.updated_at),
            }
            for t in r.targets
        ],
    }


def rollout_of(doc: Doc) -> Rollout:
    return Rollout(
        rollout_id=doc["_id"],
        policy=RolloutPolicy.model_validate(doc["policy"]),
        targets=tuple(
            Target(
                device_id=t["device_id"],
                wave=int(t["wave"]),
                state=DeployState(t["state"]),
                reason=t.get("reason"),
                told_at=from_ms(t.get("told_at_ms")),
                updated_at=from_ms(t.get("updated_at_ms")),
            )
            for t in doc["targets"]
        ),
        phase=RolloutPhase(doc["phase"]),
        wave=int(doc["wave"]),
        reason=doc.get("reason"),
        finished_at=from_ms(doc.get("finished_at_ms")),
    )


def rollout_view(doc: Doc, names: dict[str, str]) -> RolloutView:
    r = rollout_of(doc)
    return RolloutView(
        rollout_id=r.rollout_id,
        region=doc["region"],
        config=doc["config"],
        phase=r.phase,
        reason=r.reason,
        policy=r.policy,
        devices=[
            RolloutDeviceView(
                device_id=t.device_id,
                name=names.get(t.device_id, t.device_id),
                wave=t.wave,
                state=t.state,
                reason=t.reason,
                updated_at=t.updated_at,
            )
            for t in r.targets
        ],
        created_at=at(doc["created_at_ms"]),
        finished_at=r.finished_at,
    )


def _ms(when: datetime | None) -> int | None:
    return None if when is None else now_ms(when)


def at(ms: int) -> datetime:
    """A stored time that is always there."""
    return datetime.fromtimestamp(ms / 1000, UTC)
