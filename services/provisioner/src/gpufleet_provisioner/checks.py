"""Verified nodes: the GPU checks asked of nodes, their answers and the verdicts kept.

The control plane asks, the node answers. A check is asked at every registration (and the
node is unverified at once when it registers other hardware than its last check saw), when
the node's owner or an operator asks, once a day of a verified node
(GPUFLEET_NODE_CHECK_INTERVAL_S), and again after GPUFLEET_NODE_CHECK_RETRY_S of a node
whose check could not run. Asking stores the check (a hash of its nonce, its deadline, the
hardware it is about) and emits `VerifyGpus` to the node's own command stream in the same
transaction. An answer counts only on the node's own subject, for the check outstanding,
with its nonce, before its deadline; anything else is ignored (logged). The verdict
(verification.py) is kept on the node with what was checked and when, and published as
`NodeVerified`; the scheduler lets only verified nodes take other accounts' jobs.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet_bus import Delivery, emit, on_its_own_subject
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.nodes import GpuInfo, HardwareInventory, NodeDetail, NodeState
from gpufleet_contracts.verification import (
    AdminVerifyNode,
    GpuCheckReported,
    NodeVerified,
    VerifyGpus,
    VerifyNode,
)
from gpufleet_store import Doc, Transaction, from_ms, now_ms

from .records import LIVE_STATES, Records, node_id_for
from .verification import CheckPolicy, Claim, Verdict, changed, judge, late, unanswered
from .views import node_detail

log = logging.getLogger("gpufleet.provisioner")

NOT_CHECKED = "not checked yet"


def claim_of(node: Doc) -> Claim:
    """What a stored node's registration claims (what its check is judged against)."""
    hw = node.get("hardware")
    return Claim.of(
        [GpuInfo.model_validate(g) for g in node.get("gpus") or []],
        bool(node.get("simulated")),
        None if hw is None else HardwareInventory.model_validate(hw),
    )


def nonce_hash(nonce: str) -> str:
    """What is stored of a check's nonce: enough to recognise it, not to answer with it."""
    return hashlib.sha256(nonce.encode()).hexdigest()


@dataclass(frozen=True)
class Registered:
    """What a registration does to a node's verification: the fields to store, and what
    its NodeRegistered says."""

    fields: Doc
    verified: bool
    rev: int


class NodeChecks:
    def __init__(self, records: Records, policy: CheckPolicy | None = None) -> None:
        self.records = records
        self.db = records.db
        self.settings = records.settings
        self.policy = policy or CheckPolicy(memory_margin=self.settings.node_check_memory_margin)

    # --- asking -------------------------------------------------------------------------

    def ask(self, tx: Transaction, node: Doc, claim: Claim, why: str) -> Doc:
        """Emit a check for `node` in `tx`; the `gpu_check` to store (its nonce only hashed)."""
        now = self.records.clock()
        deadline_s = self.settings.node_check_deadline_s
        nonce = secrets.token_urlsafe(32)
        check_id = uuid.uuid4().hex
        deadline = now + timedelta(seconds=deadline_s)
        emit(
            tx,
            VerifyGpus(
                minion_id=node["minion_id"],
                check_id=check_id,
                nonce=nonce,
                # the node's own budget: its answer, even "timed out", arrives in time
                timeout_s=round(deadline_s * 0.8, 1),
                deadline=deadline,
            ),
            msg_id=f"verify-gpus:{check_id}",
        )
        log.info("GPU check %s asked of node %s (%s)", check_id, node["minion_id"], why)
        return {
            "check_id": check_id,
            "nonce_sha256": nonce_hash(nonce),
            "sent_at_ms": now_ms(now),
            "deadline_ms": now_ms(deadline),
            "fingerprint": claim.fingerprint(),
            "why": why,
        }

    def registered(self, tx: Transaction, existing: Doc | None, doc: Doc) -> Registered:
        """A registration (`doc`, the node's new fields; `existing`, as it was stored):
        verified only while it claims the hardware its last passed check saw; a check is
        asked unless the node is removed."""
        claim = claim_of(doc)
        before: Doc = dict((existing or {}).get("verification") or {})
        rev = int((existing or {}).get("verification_rev") or 0)
        if before.get("verified") and before.get("fingerprint") != claim.fingerprint():
            verification = _stored(changed(), self.records.clock(), None, [])
            rev += 1
            log.warning("node %s registered other hardware: unverified", doc["minion_id"])
        elif before:
            verification = before
        else:
            verification = {"verified": False, "reason": NOT_CHECKED, "checks": []}
        fields: Doc = {"verification": verification, "verification_rev": rev}
        if doc.get("state") != NodeState.removed.value:
            fields["gpu_check"] = self.ask(tx, doc, claim, "registered by its agent")
            fields["next_check_ms"] = None
        return Registered(fields, bool(verification.get("verified")), rev)

    async def verify_node(self, body: VerifyNode, account: str) -> NodeDetail:
        """A GPU check of one of the account's nodes, now."""
        return await self._ask_now(await self.records.find_node(account, body.node), "owner")

    async def admin_verify_node(self, body: AdminVerifyNode) -> NodeDetail:
        """An operator's: a GPU check of a node of `account`, now."""
        node = await self.records.find_node(body.account, body.node)
        return await self._ask_now(node, "operator")

    async def _ask_now(self, node: Doc, who: str) -> NodeDetail:
        name = node["name"]
        if node.get("kind", "compute") != "compute" or node["state"] not in LIVE_STATES:
            raise Refused(
                "conflict",
                f"node {name!r} is {node['state']}; only an active compute node or one in "
                "maintenance is checked",
            )
        pending = node.get("gpu_check")
        now = self.records.clock()
        if pending and pending["deadline_ms"] > now_ms(now):
            sent, until = from_ms(pending["sent_at_ms"]), from_ms(pending["deadline_ms"])
            raise Refused(
                "conflict",
                f"node {name!r} was asked for a GPU check at {sent:%H:%M:%S}; it has until "
                f"{until:%H:%M:%S} UTC to answer",
            )

        try:
            await self._ask_once(node, f"asked by its {who}")
        except _Superseded:
            raise Refused(
                "conflict", f"node {name!r} was asked for a GPU check meanwhile"
            ) from None
        fresh = await self.db.nodes.find_one({"_id": node["_id"]})
        return node_detail(fresh or node)

    # --- answers ------------------------------------------------------------------------

    async def reported(self, body: GpuCheckReported, delivery: Delivery) -> None:
        """A node's answer: only on its own subject, to its outstanding check, with that
        check's nonce; judged late after the deadline (the stream's time of arrival)."""
        if not on_its_own_subject(delivery.subject, body.minion_id):
            return
        now = self.records.clock()
        arrived = delivery.received_at or now

        async def tx_body(tx: Transaction) -> Verdict | None:
            node = await self.db.nodes.find_one(
                {"_id": node_id_for(body.minion_id)}, session=tx.session
            )
            pending = (node or {}).get("gpu_check")
            if node is None or not pending or pending["check_id"] != body.check_id:
                log.warning(
                    "GPU check %s of node %s: no such check outstanding; ignored",
                    body.check_id,
                    body.minion_id,
                )
                return None
            if not hmac.compare_digest(pending["nonce_sha256"], nonce_hash(body.nonce)):
                log.warning(
                    "GPU check %s of node %s answered with another nonce; ignored",
                    body.check_id,
                    body.minion_id,
                )
                return None
            claim = claim_of(node)
            late_s = (now_ms(arrived) - int(pending["deadline_ms"])) / 1000
            if claim.fingerprint() != pending["fingerprint"]:
                verdict = changed()
            elif late_s > 0:
                verdict = late(late_s)
            else:
                verdict = judge(claim, body.result, self.policy, _proved(node, claim))
            recorded = await self.record(tx, node, verdict, claim, check_id=body.check_id)
            return verdict if recorded else None

        verdict = await self.records.transaction(tx_body)
        if verdict is not None:
            level = logging.INFO if verdict.verified else logging.WARNING
            log.log(
                level,
                "node %s %s",
                body.minion_id,
                "verified" if verdict.verified else f"not verified: {verdict.reason}",
            )

    async def record(
        self, tx: Transaction, node: Doc, verdict: Verdict, claim: Claim, *, check_id: str
    ) -> bool:
        """Keep `verdict` on the node (while check `check_id` is still the outstanding one)
        and publish it. False: another answer or the round came first."""
        now = self.records.clock()
        rev = int(node.get("verification_rev") or 0) + 1
        verification = _stored(
            verdict,
            now,
            claim.fingerprint(),
            [g.uuid for g in claim.gpus] if verdict.verified else [],
        )
        if verdict.verified:
            next_ms: int | None = now_ms(now) + int(self.settings.node_check_interval_s * 1000)
        elif verdict.retry:
            next_ms = now_ms(now) + int(self.settings.node_check_retry_s * 1000)
        else:
            next_ms = None  # only a new registration, or someone asking, checks it again
        res = await self.db.nodes.update_one(
            {"_id": node["_id"], "gpu_check.check_id": check_id},
            {
                "$set": {
                    "verification": verification,
                    "verification_rev": rev,
                    "gpu_check": None,
                    "next_check_ms": next_ms,
                }
            },
            session=tx.session,
        )
        if res.matched_count == 0:
            return False
        emit(
            tx,
            NodeVerified(
                node_id=node["_id"],
                minion_id=node["minion_id"],
                verified=verdict.verified,
                verification_rev=rev,
                reason=verdict.reason,
                checked_at=now,
                at=now,
            ),
            msg_id=f"node-verified:{node['_id']}:{rev}",
        )
        return True

    # --- the round ----------------------------------------------------------------------

    async def round(self) -> None:
        """Checks past their deadline fail; nodes due for a check are asked."""
        now = now_ms(self.records.clock())
        overdue = await self.db.nodes.find({"gpu_check.deadline_ms": {"$lt": now}}).to_list(None)
        for node in overdue:
            await self._unanswered(node)
        due = await self.db.nodes.find(
            {"next_check_ms": {"$lte": now}, "state": {"$in": list(LIVE_STATES)}}
        ).to_list(None)
        for node in due:
            if node.get("gpu_check") is None and node.get("kind", "compute") == "compute":
                await self._ask_due(node)

    async def _unanswered(self, node: Doc) -> None:
        verdict = unanswered(self.settings.node_check_deadline_s)
        check_id = str(node["gpu_check"]["check_id"])

        async def body(tx: Transaction) -> bool:
            return await self.record(tx, node, verdict, claim_of(node), check_id=check_id)

        if await self.records.transaction(body):
            log.warning("node %s not verified: %s", node["minion_id"], verdict.reason)

    async def _ask_due(self, node: Doc) -> None:
        why = "due again" if (node.get("verification") or {}).get("verified") else "retry"
        with contextlib.suppress(_Superseded):  # asked meanwhile (a registration, its owner)
            await self._ask_once(node, why)

    async def _ask_once(self, node: Doc, why: str) -> None:
        """Ask `node` for a check, unless its outstanding check (or its lack of one) changed
        since `node` was read: then nothing is stored or sent (_Superseded)."""
        pending = node.get("gpu_check")
        same: Doc = {"gpu_check.check_id": pending["check_id"]} if pending else {"gpu_check": None}

        async def body(tx: Transaction) -> None:
            check = self.ask(tx, node, claim_of(node), why)
            res = await self.db.nodes.update_one(
                {"_id": node["_id"], **same},
                {"$set": {"gpu_check": check, "next_check_ms": None}},
                session=tx.session,
            )
            if res.matched_count == 0:
                raise _Superseded  # the transaction, and the command it emitted, roll back

        await self.records.transaction(body)


class _Superseded(Exception):
    """The node's outstanding check changed while another was being asked."""


def _proved(node: Doc, claim: Claim) -> list[str]:
    """The GPUs a passed check of this very hardware proved (a busy one is not re-measured)."""
    v = node.get("verification") or {}
    if v.get("verified") and v.get("fingerprint") == claim.fingerprint():
        return [str(u) for u in v.get("proved") or []]
    return []


def _stored(verdict: Verdict, at: datetime, fingerprint: str | None, proved: list[str]) -> Doc:
    return {
        "verified": verdict.verified,
        "reason": verdict.reason,
        "checks": list(verdict.checks),
        "checked_at_ms": now_ms(at),
        "fingerprint": fingerprint,
        "proved": proved,
        "retry": verdict.retry,
    }
