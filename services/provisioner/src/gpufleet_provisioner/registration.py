"""A node agent's registration (R-NODE-2/4): its inventory, checked and stored.

The node is the one the command's subject names (only its credential may publish there),
and its account and region are its enrolment's, never the payload's (R-TEN-2). A compute
node of a physical region is checked against R-NODE-4 and stays out of service, with every
failed rule visible, until it passes. A node added by an operator lands in `maintenance`
(an operator turns maintenance off: `active`); GPUFLEET_AUTO_ACTIVATE_NODES (development)
activates a passing node at once, and lets an agent that nobody added register itself
(creating its region when missing). A cloud node is active at once. Every registration
asks the node for a GPU check, and one of other hardware than its last passed check saw
unverifies it at once (checks.py: verified nodes).
"""

from __future__ import annotations

import logging

from gpufleet_auth import sealing
from gpufleet_bus import Delivery, emit
from gpufleet_contracts import subjects
from gpufleet_contracts.nodes import NodeRegistered, NodeState, RegisterNode
from gpufleet_store import Doc, Transaction, now_ms

from .checks import NodeChecks
from .hardware import check_hardware
from .identity import Identity
from .records import LIVE_STATES, Records, node_id_for

log = logging.getLogger("gpufleet.provisioner")

# A cloud instance in these states is on its way out: its agent registering changes nothing.
LEAVING = {"deleting", "deleted", "preempted", "terminated", "failed"}


class Registration:
    def __init__(self, records: Records, identity: Identity, checks: NodeChecks) -> None:
        self.records = records
        self.db = records.db
        self.identity = identity
        self.checks = checks  # verified nodes: each registration is checked (checks.py)
        self.auto_activate = records.settings.auto_activate_nodes
        # Development on a machine that is no marketplace node (a VM with a real GPU, no NVMe
        # or TPM): R-NODE-4's failures are kept and shown, and do not hold it out of service.
        self.waive_hardware = records.settings.waive_hardware_rules

    async def register_node(self, body: RegisterNode, delivery: Delivery) -> None:
        """A node agent's registration: only an enrolled node's own, for its enrolment's
        account and region."""
        minion = subjects.token_at(delivery.subject, 4)
        enrolled = await self.identity.enrolment(minion or "")
        if minion != body.minion_id or enrolled is None:
            log.warning(
                "RegisterNode for %s on %s: not an enrolled node's own subject; ignored",
                body.minion_id,
                delivery.subject,
            )
            return
        body = vouched_key(body, enrolled)
        await self.register(body, delivery.id, enrolled["account"], enrolled["region"])

    async def register(
        self, cmd: RegisterNode, command_id: str | None, account: str, region_name: str
    ) -> None:
        """`account` and `region_name` are the node's enrolment's: the payload's own
        `owner` and `region` are not trusted (R-TEN-2, R-NODE-2)."""
        cmd = cmd.model_copy(update={"owner": account, "region": region_name})
        now = self.records.clock()
        node_id = node_id_for(cmd.minion_id)

        async def body(tx: Transaction) -> None:
            s = tx.session
            region = await self.db.regions.find_one(
                {"owner": cmd.owner, "name": cmd.region}, session=s
            )
            existing = await self.db.nodes.find_one({"_id": node_id}, session=s)
            if region is None:
                if existing is not None or not self.auto_activate:
                    log.warning(
                        "node %s registers in unknown region %s of %s: ignored",
                        cmd.minion_id,
                        cmd.region,
                        cmd.owner,
                    )
                    return
                # Development: an agent nobody added creates its physical region.
                region = {
                    "_id": f"{cmd.owner}/{cmd.region}",
                    "owner": cmd.owner,
                    "name": cmd.region,
                    "provider": "physical",
                    "storage_mode": "local",
                    "allow_public_jobs": False,
                    "created_at_ms": now_ms(now),
                    "auto_created": True,
                }
                await self.db.regions.insert_one(region, session=s)
            if existing is not None and existing["owner"] != cmd.owner:
                log.warning("node %s registers for another account: ignored", cmd.minion_id)
                return
            cloud = region["provider"] == "gcp"
            failures: list[str] = []
            held: list[str] = []  # the failures that keep it out of service
            if not cloud:
                failures = [
                    str(f)
                    for f in check_hardware(
                        cmd.gpus,
                        cmd.hardware,
                        storage_mode=str(region.get("storage_mode") or "local"),
                        allow_public_jobs=bool(region.get("allow_public_jobs")),
                    )
                ]
                held = [] if self.waive_hardware else list(failures)
                missing = await self.records.storage_missing(region, s)
                if missing:
                    failures.append(missing)
                    held.append(missing)
            state = self.registered_state(existing, cloud, held)
            cpu_count, cpu_job_cpus = registered_cpus(cmd)
            doc: Doc = {
                "minion_id": cmd.minion_id,
                "name": existing["name"] if existing else cmd.name,
                "region": cmd.region,
                "owner": cmd.owner,
                "kind": "compute",
                "provider": region["provider"],
                "state": state.value,
                "gpus": [g.model_dump(mode="json") for g in cmd.gpus],
                "hardware": None if cmd.hardware is None else cmd.hardware.model_dump(mode="json"),
                "failed_rules": failures,
                "simulated": cmd.simulated,
                "inventory_source": cmd.inventory_source,
                "driver_version": cmd.driver_version,
                "hostname": cmd.hostname,
                "heartbeat_s": cmd.heartbeat_s,
                "price_per_gpu_hour": None
                if cmd.price_per_gpu_hour is None
                else str(cmd.price_per_gpu_hour),
                "cpu_job_cpus": cpu_job_cpus,
                "price_per_cpu_hour": None
                if cmd.price_per_cpu_hour is None
                else str(cmd.price_per_cpu_hour),
                # its workers' secrets are sealed to it (none: an agent too old for them)
                "sealing_key": cmd.sealing_key,
                # the base environments it runs (R-JOB-7); None: an agent older than that
                "environments": None
                if cmd.environments is None
                else cmd.environments.model_dump(mode="json"),
                "proxy_url": cmd.proxy_url,  # where its endpoints are served (None: none)
                "registered_at_ms": now_ms(now),
                "agent_started_at": cmd.agent_started_at.isoformat(),
                "last_seen_ms": now_ms(now),
            }
            if cloud:
                doc["idle_since_ms"] = now_ms(now)
            # Verified while it claims the hardware its last passed GPU check saw; asked
            # for a check now (checks.py).
            verification = self.checks.registered(tx, existing, doc)
            doc.update(verification.fields)
            update: Doc = {"$set": doc}
            if existing is None or existing["state"] != state.value:
                reason = "; ".join(held) if held else "registered by its agent"
                update["$push"] = {
                    "history": {"state": state.value, "at_ms": now_ms(now), "reason": reason}
                }
            await self.db.nodes.update_one({"_id": node_id}, update, upsert=True, session=s)
            emit(
                tx,
                NodeRegistered(
                    node_id=node_id,
                    minion_id=cmd.minion_id,
                    name=doc["name"],
                    region=cmd.region,
                    owner=cmd.owner,
                    state=state,
                    gpus=cmd.gpus,
                    simulated=cmd.simulated,
                    price_per_gpu_hour=cmd.price_per_gpu_hour,
                    allow_public_jobs=bool(region.get("allow_public_jobs")),
                    gpu_shares=cmd.gpu_shares,
                    cpu_count=cpu_count,
                    cpu_job_cpus=cpu_job_cpus,
                    price_per_cpu_hour=cmd.price_per_cpu_hour,
                    verified=verification.verified,
                    verification_rev=verification.rev,
                    sealing_key=cmd.sealing_key,
                    environments=cmd.environments,
                    proxy_url=cmd.proxy_url,
                    at=now,
                ),
                # The same RegisterNode delivered twice yields one NodeRegistered.
                msg_id=f"registered:{command_id}" if command_id else None,
            )
            if failures:
                log.warning(
                    "node %s fails rules%s: %s",
                    cmd.minion_id,
                    " and stays out of service" if held else " (waived: development)",
                    "; ".join(failures),
                )

        await self.records.transaction(body)
        log.info(
            "node %s registered in region %s (%d GPUs%s)",
            cmd.minion_id,
            cmd.region,
            len(cmd.gpus),
            ", simulated" if cmd.simulated else "",
        )

    def registered_state(self, existing: Doc | None, cloud: bool, held: list[str]) -> NodeState:
        """The state a registration puts a node in (see the module's docstring); `held`:
        the failed rules that keep it out of service."""
        current = None if existing is None else existing["state"]
        if current == NodeState.removed.value:
            return NodeState.removed
        if cloud:
            # A cloud node is active at once (R-NODE-2), unless it is on its way out.
            if existing is not None and (existing.get("cloud") or {}).get("state") in LEAVING:
                return NodeState(current) if current else NodeState.maintenance
            return NodeState.active
        if held:
            return NodeState.maintenance  # out of service, reasons in failed_rules
        if existing is None or current in (NodeState.lost.value, NodeState.provisioning.value):
            previous = (existing or {}).get("state_before_lost")
            if current == NodeState.lost.value and previous in LIVE_STATES:
                return NodeState(previous)
            # R-NODE-2: provisioned, it lands in maintenance for the operator (development:
            # GPUFLEET_AUTO_ACTIVATE_NODES activates it at once).
            return NodeState.active if self.auto_activate else NodeState.maintenance
        return NodeState(str(current))


def registered_cpus(cmd: RegisterNode) -> tuple[int | None, int]:
    """The node's logical CPUs (its reported hardware) and how many of them it offers to
    CPU-only jobs (R-JOB-2): its agent's setting, never more than it has."""
    cores = None if cmd.hardware is None else cmd.hardware.cpu_cores
    offered = cmd.cpu_job_cpus if cores is None else min(cmd.cpu_job_cpus, cores)
    return cores, offered


def vouched_key(cmd: RegisterNode, enrolled: Doc) -> RegisterNode:
    """`cmd` with its sealing key only if the nkey the node enrolled with signed it
    (gpufleet_auth.sealing.vouched): another credential that may publish on the node's
    subject (an operator's) cannot have the node's secrets sealed to a key of its own. A
    key not vouched for is dropped: the node then gets no job with secrets."""
    key = cmd.sealing_key
    nkey = str(enrolled.get("public_key") or "")
    if key is None or sealing.vouched(nkey, key, cmd.sealing_key_signature):
        return cmd
    log.warning("node %s: a sealing key its own nkey did not sign; not kept", cmd.minion_id)
    return cmd.model_copy(update={"sealing_key": None, "sealing_key_signature": None})
