"""Whole service replies for the CLI's tests: the CLI reads each reply as its contract model,
so a test names the values it is about and takes neutral ones for the rest (each helper's
result validates as the model it stands for)."""

from __future__ import annotations

from typing import Any

from gpufleet_contracts.jobviews import JobView
from gpufleet_contracts.nodes import GpuInfo, NodeDetail, NodeView, VerificationDetail


def gpu(**fields: Any) -> dict[str, Any]:
    out = {"index": 0, "uuid": "GPU-0", "model": None, "nvml_name": "GPU", "memory_mb": 0}
    out.update(fields)
    GpuInfo.model_validate(out)
    return out


def node(**fields: Any) -> dict[str, Any]:
    """A NodeView (`node list`'s items, `node add`'s reply)."""
    out: dict[str, Any] = {
        "node_id": "node-1",
        "minion_id": "m-1",
        "name": "node-1",
        "region": "lab",
        "owner": "acme",
        "state": "active",
        "kind": "compute",
        "provider": "physical",
        "gpus": [],
        "simulated": False,
        "inventory_source": None,
        "failed_rules": [],
        "last_seen": None,
        "telemetry": None,
    }
    out.update(fields)
    out["gpus"] = [gpu(**g) for g in out["gpus"]]
    NodeView.model_validate(out)
    return out


def node_detail(**fields: Any) -> dict[str, Any]:
    """A NodeDetail (`node show`'s reply)."""
    out = node(
        **{
            "sealing_key": None,
            "hardware": None,
            "history": [],
            "busy": False,
            "idle_since": None,
            **fields,
        }
    )
    NodeDetail.model_validate(out)
    return out


def verification(**fields: Any) -> dict[str, Any]:
    """A node's VerificationDetail."""
    out = {"verified": False, "reason": None, "checked_at": None, "checks": [], "next_check": None}
    out.update(fields)
    VerificationDetail.model_validate(out)
    return out


def job(**fields: Any) -> dict[str, Any]:
    """A JobView (`job show`'s reply, `job list`'s items)."""
    out: dict[str, Any] = {
        "id": "j1",
        "name": "job-1",
        "project": "default",
        "owner": "acme",
        "creator": "acme",
        "state": "queued",
        "spec": {},
        "history": [],
        "notes": [],
        "workers": [],
    }
    out.update(fields)
    JobView.model_validate(out)
    return out
