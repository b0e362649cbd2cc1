"""The stored alert rules and alerts, and the one way an alert changes (`apply`: its new state,
its AlertFired or AlertResolved, and its node's maintenance, in one transaction).

Collections: `alert_rules` (the accounts' and operators' rules; the built-in ones live in
code), `alert_status` (each rule's last evaluation), `alerts` (pending and firing alerts,
and the resolved ones kept for a while) and `alert_keys` (a rule's label set while it alerts:
its `_id` makes two evaluations that both saw it start write one alert, not two).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from gpufleet_bus import emit
from gpufleet_contracts.alerts import AlertFired, AlertResolved, AlertState
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.nodes import NodeState
from gpufleet_store import Doc, Transaction, now_ms
from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument

from ..records import Records
from .states import Instance, Step
from .views import Rule, alert_doc, alert_view, from_doc, instance_fields, instance_of, rule_doc

log = logging.getLogger("gpufleet.provisioner.alerts")

INDEXES = {
    "alert_rules": [IndexModel([("account", ASCENDING), ("spec.name", ASCENDING)], unique=True)],
    "alerts": [
        IndexModel([("rule_id", ASCENDING), ("state", ASCENDING)]),
        IndexModel([("visible_to", ASCENDING), ("started_at_ms", DESCENDING)]),
        IndexModel([("state", ASCENDING), ("resolved_at_ms", ASCENDING)]),
    ],
    "alert_keys": [IndexModel([("rule_id", ASCENDING)])],
}
LIVE = [AlertState.pending.value, AlertState.firing.value]


def alert_id(rule: Rule, key: str, instance: Instance) -> str:
    """One alert: its rule, its label set and when it began (a label set that alerts again
    after it resolved is a new alert)."""
    return f"{rule.id}.{key}.{now_ms(instance.started_at)}"


class AlertBook:
    def __init__(self, records: Records, rules_per_account: int, resolved_keep_s: float) -> None:
        self.records = records
        self.db = records.db
        self.rules_per_account = rules_per_account
        self.resolved_keep = timedelta(seconds=resolved_keep_s)

    # --- rules ----------------------------------------------------------------------------

    async def add_rule(self, rule: Rule) -> None:
        async def body(tx: Transaction) -> None:
            s = tx.session
            taken = await self.db.alert_rules.find_one(
                {"account": rule.account, "spec.name": rule.name}, session=s
            )
            if taken is not None:
                raise Refused.of_field(
                    "conflict",
                    f"a rule named {rule.name!r} exists",
                    field="name",
                    rule="R-OPS-1",
                    says="taken",
                    valid="a name none of your rules has",
                )
            if rule.account is not None:
                held = await self.db.alert_rules.count_documents(
                    {"account": rule.account}, session=s
                )
                if held >= self.rules_per_account:
                    raise Refused(
                        "invalid",
                        f"an account keeps at most {self.rules_per_account} alert rules",
                        [
                            {
                                "field": "name",
                                "rule": "limit:alert_rules",
                                "message": f"{held} rules already",
                                "valid": f"at most {self.rules_per_account}",
                            }
                        ],
                    )
            await self.db.alert_rules.insert_one(rule_doc(rule), session=s)

        await self.records.transaction(body)

    async def rules(self, account: str | None = None) -> list[Rule]:
        """The stored rules (`account`'s only, when given), by name."""
        query: Doc = {} if account is None else {"account": account}
        docs = await self.db.alert_rules.find(query).sort("spec.name", 1).to_list(None)
        return [from_doc(d) for d in docs]

    async def rule(self, ref: str, account: str | None, *, any_account: bool = False) -> Rule:
        """A stored rule by id (or by name among `account`'s: None, the operators')."""
        by = [{"_id": ref}, {"spec.name": ref}]
        query: Doc = {"$or": by, "account": account}
        if any_account:
            query = {"$or": [{"_id": ref}, {"spec.name": ref, "account": None}]}
        doc = await self.db.alert_rules.find_one(query)
        if doc is None:
            raise NotFound(f"alert rule {ref!r} not found")
        return from_doc(doc)

    async def remove_rule(self, rule: Rule) -> None:
        """The rule and its alerts; a firing one resolves (its AlertResolved is sent)."""
        now = self.records.clock()

        async def body(tx: Transaction) -> None:
            s = tx.session
            firing = await self.db.alerts.find(
                {"rule_id": rule.id, "state": AlertState.firing.value}, session=s
            ).to_list(None)
            for doc in firing:
                done = instance_of(doc)
                resolved = Instance(
                    done.labels, AlertState.resolved, done.started_at, done.value,
                    fired_at=done.fired_at, resolved_at=now,
                )  # fmt: skip
                self._resolved(tx, {**doc, **instance_fields(rule, resolved)})
            await self.db.alerts.delete_many({"rule_id": rule.id}, session=s)
            await self.db.alert_keys.delete_many({"rule_id": rule.id}, session=s)
            await self.db.alert_status.delete_one({"_id": rule.id}, session=s)
            await self.db.alert_rules.delete_one({"_id": rule.id}, session=s)

        await self.records.transaction(body)

    async def statuses(self, ids: Sequence[str]) -> dict[str, Doc]:
        docs = await self.db.alert_status.find({"_id": {"$in": list(ids)}}).to_list(None)
        return {d["_id"]: d for d in docs}

    async def evaluated(
        self, rule: Rule, at: datetime, error: str | None, truncated: bool = False
    ) -> None:
        await self.db.alert_status.update_one(
            {"_id": rule.id},
            {"$set": {"evaluated_at_ms": now_ms(at), "error": error, "truncated": truncated}},
            upsert=True,
        )

    # --- alerts ---------------------------------------------------------------------------

    async def alerts(self, query: Doc, limit: int) -> list[Doc]:
        cursor = self.db.alerts.find(query).sort("started_at_ms", -1).limit(limit)
        docs: list[Doc] = await cursor.to_list(None)
        return docs

    async def live(self, rule: Rule) -> dict[str, tuple[str, Instance]]:
        """The rule's pending and firing alerts by label-set key: (alert id, instance)."""
        docs = await self.db.alerts.find({"rule_id": rule.id, "state": {"$in": LIVE}}).to_list(None)
        return {d["key"]: (d["_id"], instance_of(d)) for d in docs}

    async def apply(self, rule: Rule, steps: Sequence[Step], ids: dict[str, str]) -> None:
        """One evaluation's changes of `rule`'s alerts (`ids`: the stored ones' by key), each
        transition stated once: a stored alert changes only from the state it was read in."""

        async def body(tx: Transaction) -> None:
            if not rule.builtin and not await self._kept(tx, rule):
                return  # removed meanwhile: its alerts went with it
            for step in steps:
                await self._step(tx, rule, step, ids.get(step.key))

        await self.records.transaction(body)

    async def _kept(self, tx: Transaction, rule: Rule) -> bool:
        return await self.db.alert_rules.find_one({"_id": rule.id}, session=tx.session) is not None

    async def _step(self, tx: Transaction, rule: Rule, step: Step, stored: str | None) -> None:
        s = tx.session
        before, after = step.before, step.after
        live_key = f"{rule.id}.{step.key}"
        if after is None:  # a pending alert whose condition is gone: it never fired
            gone = await self.db.alerts.delete_one({"_id": stored, "state": LIVE[0]}, session=s)
            if gone.deleted_count:
                await self.db.alert_keys.delete_one({"_id": live_key}, session=s)
            return
        if before is None or stored is None:
            doc = {**alert_doc(alert_id(rule, step.key, after), rule, after), "key": step.key}
            # a duplicate key (another evaluation started it) aborts the whole transaction
            key_doc = {"_id": live_key, "rule_id": rule.id, "alert": doc["_id"]}
            await self.db.alert_keys.insert_one(key_doc, session=s)
            await self.db.alerts.insert_one(doc, session=s)
        else:
            fields = instance_fields(rule, after)
            changed: Doc | None = await self.db.alerts.find_one_and_update(
                {"_id": stored, "state": before.state.value},
                {"$set": fields},
                session=s,
                return_document=ReturnDocument.AFTER,
            )
            if changed is None:
                return  # changed meanwhile (another evaluation): stated there
            doc = changed
        if step.fired:
            emit(tx, AlertFired(alert=alert_view(doc)), msg_id=f"alert-fired:{doc['_id']}")
            if rule.spec.maintenance:
                await self._maintenance(tx, rule, doc)
        elif step.resolved:
            await self.db.alert_keys.delete_one({"_id": live_key}, session=s)
            self._resolved(tx, doc)

    def _resolved(self, tx: Transaction, doc: Doc) -> None:
        emit(tx, AlertResolved(alert=alert_view(doc)), msg_id=f"alert-resolved:{doc['_id']}")

    async def _maintenance(self, tx: Transaction, rule: Rule, doc: Doc) -> None:
        """The node the alert names (`node`: its minion id) into maintenance, if active and,
        for an account's rule, that account's."""
        minion = doc["labels"].get("node")
        if not minion:
            return
        query: Doc = {"minion_id": minion, "state": NodeState.active.value}
        if rule.account is not None:
            query["owner"] = rule.account
        node = await self.db.nodes.find_one(query, session=tx.session)
        if node is None:
            return
        summary = doc.get("annotations", {}).get("summary") or ""
        reason = f"alert {rule.name}" + (f": {summary}" if summary else "")
        await self.records.set_state(tx, node, NodeState.maintenance, reason[:500])

    async def prune(self, now: datetime, per_rule: int, rule_ids: Sequence[str]) -> None:
        """Resolved alerts past their keep, and past `per_rule` of each of `rule_ids`."""
        cutoff = now_ms(now - self.resolved_keep)
        await self.db.alerts.delete_many(
            {"state": AlertState.resolved.value, "resolved_at_ms": {"$lt": cutoff}}
        )
        for rid in rule_ids:
            old = (
                await self.db.alerts.find(
                    {"rule_id": rid, "state": AlertState.resolved.value}, {"_id": 1}
                )
                .sort("resolved_at_ms", -1)
                .skip(per_rule)
                .to_list(None)
            )
            if old:
                await self.db.alerts.delete_many({"_id": {"$in": [d["_id"] for d in old]}})
