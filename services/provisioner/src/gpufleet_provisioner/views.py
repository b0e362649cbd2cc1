"""What an account is shown of its providers, regions and nodes (the replies' items; the CLI
shows every key it gets, so a key without a value is left out rather than sent as null)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from gpufleet_auth import sealing
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


def provider_view(doc: Doc) -> Doc:
    """What may be shown of a provider: never the key."""
    out = {
        "account": doc["account"],
        "provider": doc["provider"],
        "payment_mode": doc["payment_mode"],
        "enabled_at": iso(from_ms(doc.get("enabled_at_ms"))),
    }
    for k in ("gcp_project_id", "client_email", "lifecycle", "policy"):
        if doc.get(k) is not None:
            out[k] = doc[k]
    return out


def region_view(doc: Doc) -> Doc:
    out = {
        "name": doc["name"],
        "owner": doc["owner"],
        "provider": doc["provider"],
        "storage_mode": doc.get("storage_mode"),
        "allow_public_jobs": bool(doc.get("allow_public_jobs")),
        "created_at": iso(from_ms(doc.get("created_at_ms"))),
    }
    for k in ("quotas", "runnable_jobs", "zones", "storage_class", "storage_size_gb"):
        if doc.get(k) is not None:
            out[k] = doc[k]
    return out


def node_view(n: Doc, full: bool = False) -> Doc:
    """A node as listed; `full`: as shown alone (hardware, history, idleness)."""
    out: Doc = {
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
    }
    verification = verification_view(n, full)
    if verification is not None:
        out["verified"] = verification["verified"]
        out["verification"] = verification
    if n.get("cloud"):
        cloud = dict(n["cloud"])
        cloud["history"] = entries(cloud.get("history"))
        if not full:
            cloud.pop("history", None)
        out["cloud"] = cloud
    if full:
        key = n.get("sealing_key")  # its id only: which key its secrets are sealed to
        out["sealing_key"] = sealing.key_id(key) if key else None
        out["hardware"] = n.get("hardware")
        if n.get("environments"):  # the base environments it runs (R-JOB-7)
            out["environments"] = n["environments"]
        out["history"] = entries(n.get("history"))
        out["busy"] = bool(n.get("busy"))
        out["idle_since"] = iso(from_ms(n.get("idle_since_ms")))
    return out


def verification_view(n: Doc, full: bool = False) -> Doc | None:
    """Whether a compute node is verified (it may take other accounts' jobs), or why not,
    when it was checked and, shown alone, what was checked; a check on its way. Never the
    check's nonce. None for a node never asked (a storage node, or one from before)."""
    v = n.get("verification")
    pending = n.get("gpu_check")
    if not v and not pending:
        return None
    v = v or {}
    out: Doc = {
        "verified": bool(v.get("verified")),
        "reason": v.get("reason"),
        "checked_at": iso(from_ms(v.get("checked_at_ms"))),
    }
    if full:
        out["checks"] = [str(c) for c in v.get("checks") or []]
        out["next_check"] = iso(from_ms(n.get("next_check_ms")))
    if pending:
        out["pending"] = {
            "sent_at": iso(from_ms(pending.get("sent_at_ms"))),
            "deadline": iso(from_ms(pending.get("deadline_ms"))),
            "why": pending.get("why"),
        }
    return out
