"""Own the base, rent the burst: with on-prem capacity full, a queued job bursts to an emulated
GCP region, runs on the new instance's (simulated) node agent, and the instance is deleted
once idle; every lifecycle step arrives through sink -> Pub/Sub -> bridge -> NATS."""

from __future__ import annotations

import json
from typing import Any

import nats
from gpufleet_devstack import wait_for

from .conftest_gcp import IDLE_S, GcpSystem, gcp_system, service_account_key

__all__ = ["gcp_system"]  # the fixture, imported for pytest

PROJECT = "acme-burst"


def cloud_node(system: GcpSystem) -> dict[str, Any] | None:
    nodes = system.json("node", "list")["nodes"]
    found = [n for n in nodes if n.get("provider") == "gcp" and n.get("kind") == "compute"]
    return found[-1] if found else None


def bridged_events(system: GcpSystem) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """Every CloudInstanceEvent in the GPUFLEET_EVENTS stream, with its headers."""
    import asyncio

    async def read() -> list[tuple[dict[str, str], dict[str, Any]]]:
        nc = await nats.connect(system.nats.url, **system.nats.admin())  # an operator reads
        try:
            js = nc.jetstream()
            sub = await js.subscribe("gpufleet.v1.evt.node.cloud_instance", ordered_consumer=True)
            out = []
            while True:
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except TimeoutError:
                    return out
                except nats.errors.TimeoutError:
                    return out
                out.append((dict(msg.headers or {}), json.loads(msg.data)))
        finally:
            await nc.close()

    return asyncio.run(read())


def test_queued_job_bursts_to_gcp_runs_and_the_idle_instance_is_deleted(
    gcp_system: GcpSystem, tmp_path: Any
) -> None:
    system = gcp_system
    key = tmp_path / "key.json"
    key.write_text(service_account_key(PROJECT))
    enabled = system.cli("provider", "enable", "gcp", "--key-file", str(key), "--json")
    assert "PRIVATE KEY" not in enabled.stdout + enabled.stderr
    provider = json.loads(enabled.stdout)
    assert provider["gcp_project_id"] == PROJECT
    assert provider["lifecycle"]["writer_identity"]
    region = system.json("region", "create", "us-central1", "--provider", "gcp")
    assert region["runnable_jobs"]["V100"] >= 1

    # On-prem is full: both RTX 3090 busy. The next job accepts a 3090 or a V100 and may burst.
    blocker = system.submit("--", "sleep", "60", name="blocker", gpus=2)
    system.wait_state(blocker, "running", timeout=30)
    job = system.json(
        "job",
        "submit",
        "--name",
        "burst",
        "--gpu-type",
        "RTX 3090",
        "--gpu-type",
        "V100",
        "--gpu-count",
        "1",
        "--max-price",
        "1.0",
        "--allow-burst",
        "--",
        "python",
        "-c",
        "import time; print('ran in the cloud'); time.sleep(2)",
    )
    job_id = str(job["id"])

    wait_for(
        lambda: (n := cloud_node(system)) is not None and n["state"] == "active",
        timeout=60,
        interval=0.5,
        message="no GCP node became active",
    )
    node = cloud_node(system)
    assert node is not None
    name = node["minion_id"]
    assert node["region"] == "us-central1" and node["gpus"][0]["model"] == "V100"

    done = system.wait_state(job_id, "finished", "failed", timeout=60)
    assert done["state"] == "finished", done
    assert done["workers"][0]["node"] == name
    assert "ran in the cloud" in done["log_tail"]
    system.cli("job", "cancel", blocker, check=False)

    # Idle for IDLE_S: deleted, and the deletion came back through the audit log.
    wait_for(
        lambda: system.json("node", "show", name)["state"] == "removed",
        timeout=IDLE_S + 40,
        interval=0.5,
        message=f"{name} was never removed",
    )
    shown = system.json("node", "show", name)
    steps = [(h["action"], h["phase"]) for h in shown["cloud"]["history"] if h["applied"]]
    assert steps == [
        ("insert", "first"),
        ("insert", "last"),
        ("delete", "first"),
        ("delete", "last"),
    ]
    assert name not in [i["name"] for i in system.emulator.admin("state")["instances"]]

    events = [(h, e) for h, e in bridged_events(system) if e["instance"] == name]
    assert [(e["action"], e["phase"]) for _, e in events] == steps
    for headers, evt in events:
        assert headers["Nats-Msg-Id"] == f"gcp:{PROJECT}:{evt['pubsub_message_id']}"
    states = [h["state"] for h in shown["history"]]
    assert states[0] == "provisioning" and "active" in states and states[-1] == "removed"


def test_physical_provider_region_and_nodes_through_the_cli(gcp_system: GcpSystem) -> None:
    system = gcp_system
    assert system.json("provider", "enable", "physical")["payment_mode"] == "credits"
    stripe = system.cli("provider", "enable", "physical", "--payment-mode", "stripe", check=False)
    assert stripe.returncode == 2 and "coming soon" in stripe.stderr
    listed = system.json("provider", "list")["providers"]
    assert {p["provider"] for p in listed} == {"gcp", "physical"}
    assert all("key_encrypted" not in p for p in listed)

    system.json("region", "create", "lab-2", "--storage-mode", "central")
    early = system.cli(
        "node", "add", "--region", "lab-2", "--name", "gpu-9", "--minion-id", "gpu-9", check=False
    )
    assert early.returncode == 1 and "central storage" in early.stderr
    storage = system.json(
        "node",
        "add",
        "--region",
        "lab-2",
        "--name",
        "st-1",
        "--minion-id",
        "st-1",
        "--kind",
        "storage",
    )
    assert storage["state"] == "active"
    second = system.cli(
        "node",
        "add",
        "--region",
        "lab-2",
        "--name",
        "st-2",
        "--minion-id",
        "st-2",
        "--kind",
        "storage",
        check=False,
    )
    assert second.returncode == 1 and "replace" in second.stderr
    system.json(
        "node", "replace-storage", "--region", "lab-2", "--name", "st-2", "--minion-id", "st-2"
    )
    assert system.json("node", "show", "st-1")["state"] == "removed"

    added = system.json(
        "node", "add", "--region", "lab-2", "--name", "gpu-9", "--minion-id", "gpu-9"
    )
    assert added["state"] == "provisioning"
    activate = system.cli("node", "maintenance", "gpu-9", "off", check=False)
    assert activate.returncode == 1 and "provisioning" in activate.stderr
    assert system.json("node", "remove", "gpu-9")["state"] == "removed"
    shown = system.cli("node", "show", "gpu-9").stdout
    assert "removed by operator" in shown
