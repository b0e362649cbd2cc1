"""What an account is shown of its providers, regions and nodes: the contract replies
(gpufleet_contracts.providers and .nodes) made from the stored documents. A reply model
names what may be shown: never a provider's key, a GPU check's nonce, or more of a node's
sealing key than its id."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from gpufleet_auth import sealing
from gpufleet_contracts.nodes import (
    CloudView,
    MaintenanceSet,
    NodeDetail,
    NodeView,
    PendingCheck,
    VerificationDetail,
    VerificationView,
)
from gpufleet_contracts.providers import ProviderView, RegionView
from gpufleet_store import Doc, from_ms


def iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def entries(items: Any) -> list[Doc]:
    """A pushed list of documents. nx-27017 stores a document given to `$push` as its JSON
    text (MongoDB stores the document); reading through here means the same on both."""
    out: list[Doc] = []
    for item in items or []:
        if isinstance(item, str):
            try:
                item = json.loads(item)
            except json.JSONDecodeError:
                continue
        if isinstance(item, dict):
            out.append(item)
    return out


def provider_view(doc: Doc) -> ProviderView:
    """What may be shown of a provider: never the key."""
    return ProviderView(
        account=doc["account"],
        provider=doc["provider"],
        payment_mode=doc["payment_mode"],
        enabled_at=iso(from_ms(doc.get("enabled_at_ms"))),
        gcp_project_id=doc.get("gcp_project_id"),
        client_email=doc.get("client_email"),
        lifecycle=doc.get("lifecycle"),
        policy=doc.get("policy"),
    )


def region_view(doc: Doc) -> RegionView:
    return RegionView(
        name=doc["name"],
        owner=doc["owner"],
        provider=doc["provider"],
        storage_mode=doc.get("storage_mode"),
        allow_public_jobs=bool(doc.get("allow_public_jobs")),
        created_at=iso(from_ms(doc.get("created_at_ms"))),
        quotas=doc.get("quotas"),
        runnable_jobs=doc.get("runnable_jobs"),
        zones=doc.get("zones"),
        storage_class=doc.get("storage_class"),
        storage_size_gb=doc.get("storage_size_gb"),
    )


def _listed(n: Doc, full: bool) -> dict[str, Any]:
    """The fields of NodeView, from a stored node."""
    cloud = None
    if n.get("cloud"):
        c = n["cloud"]
        cloud = CloudView.model_validate(
            {**c, "history": entries(c.get("history")) if full else None}
        )
    verification = verification_view(n, full)
    return {
        "node_id": n["_id"],
        "minion_id": n["minion_id"],
        "name": n["name"],
        "region": n["region"],
        "owner": n["owner"],
        "state": n["state"],
        "kind": n.get("kind", "compute"),
        "provider": n.get("provider", "physical"),
        "gpus": n.get("gpus") or [],
        "simulated": bool(n.get("simulated")),
        "inventory_source": n.get("inventory_source"),
        "failed_rules": n.get("failed_rules") or [],
        "last_seen": iso(from_ms(n.get("last_seen_ms"))),
        "telemetry": n.get("telemetry"),
        "verified": None if verification is None else verification.verified,
        "verification": verification,
        "cloud": cloud,
    }


def node_view(n: Doc) -> NodeView:
    """A node as listed."""
    return NodeView.model_validate(_listed(n, full=False))


def _detail(n: Doc) -> dict[str, Any]:
    key = n.get("sealing_key")  # its id only: which key its secrets are sealed to
    return {
        **_listed(n, full=True),
        "sealing_key": sealing.key_id(key) if key else None,
        "hardware": n.get("hardware"),
        "environments": n.get("environments") or None,  # the base environments it runs
        "history": entries(n.get("history")),
        "busy": bool(n.get("busy")),
        "idle_since": iso(from_ms(n.get("idle_since_ms"))),
    }


def node_detail(n: Doc) -> NodeDetail:
    """A node as shown alone: also its hardware, history and idleness."""
    return NodeDetail.model_validate(_detail(n))


def maintenance_set(n: Doc, changed: bool) -> MaintenanceSet:
    return MaintenanceSet.model_validate({**_detail(n), "changed": changed})


def verification_view(n: Doc, full: bool = False) -> VerificationView | None:
    """Whether a compute node is verified (it may take other accounts' jobs), or why not,
    when it was checked and, shown alone, what was checked; a check on its way. None for a
    node never asked (a storage node, or one from before)."""
    v = n.get("verification")
    pending = n.get("gpu_check")
    if not v and not pending:
        return None
    v = v or {}
    fields: Doc = {
        "verified": bool(v.get("verified")),
        "reason": v.get("reason"),
        "checked_at": iso(from_ms(v.get("checked_at_ms"))),
    }
    if pending:
        fields["pending"] = PendingCheck(
            sent_at=iso(from_ms(pending.get("sent_at_ms"))),
            deadline=iso(from_ms(pending.get("deadline_ms"))),
            why=pending.get("why"),
        )
    if not full:
        return VerificationView(**fields)
    return VerificationDetail(
        **fields,
        checks=[str(c) for c in v.get("checks") or []],
        next_check=iso(from_ms(n.get("next_check_ms"))),
    )
