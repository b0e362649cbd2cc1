"""Alert rules and alerts between their stored documents, the state machine's instances and
the contracts' views (plain data; no database)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufleet_contracts.alerts import AlertRuleSpec, AlertRuleView, AlertState, AlertView
from gpufleet_store import Doc, from_ms, now_ms

from .builtin import BuiltinRule
from .rules import compile_query, render
from .states import Instance

SPEC_FIELDS = tuple(AlertRuleSpec.model_fields)


@dataclass(frozen=True)
class Rule:
    """A rule as evaluated: its spec, whose it is (None: the operators') and its query."""

    id: str
    account: str | None
    spec: AlertRuleSpec
    query: str
    builtin: bool = False
    created_at: datetime | None = None

    @property
    def name(self) -> str:
        return self.spec.name


def from_builtin(rule: BuiltinRule) -> Rule:
    return Rule(rule.id, None, rule.spec, compile_query(rule.spec, None), builtin=True)


def rule_doc(rule: Rule) -> Doc:
    return {
        "_id": rule.id,
        "account": rule.account,
        "query": rule.query,
        "created_at_ms": now_ms(rule.created_at),
        "spec": rule.spec.model_dump(mode="json"),
    }


def from_doc(doc: Doc) -> Rule:
    return Rule(
        id=doc["_id"],
        account=doc.get("account"),
        spec=AlertRuleSpec.model_validate(doc["spec"]),
        query=doc["query"],
        created_at=from_ms(doc.get("created_at_ms")),
    )


def rule_view(rule: Rule, status: Doc | None = None) -> AlertRuleView:
    status = status or {}
    return AlertRuleView.model_validate(
        {
            **rule.spec.model_dump(include=set(SPEC_FIELDS)),
            "id": rule.id,
            "account": rule.account,
            "builtin": rule.builtin,
            "query": rule.query,
            "created_at": rule.created_at,
            "last_evaluated_at": from_ms(status.get("evaluated_at_ms")),
            "last_error": status.get("error"),
            "truncated": bool(status.get("truncated")),
        }
    )


def about(rule: Rule, labels: dict[str, str]) -> tuple[str | None, list[str]]:
    """The account an alert is about, and the accounts that see it: an account's rule's,
    its own; a built-in rule's, the accounts its labels name (the job's, the node's owner).
    An operator's own rules' alerts are the operators'."""
    if rule.account is not None:
        return rule.account, [rule.account]
    named = [labels[k] for k in ("account", "owner") if labels.get(k)]
    return (named[0] if named else None), (sorted(set(named)) if rule.builtin else [])


def alert_doc(alert_id: str, rule: Rule, instance: Instance) -> Doc:
    labels = dict(instance.labels)
    account, visible_to = about(rule, labels)
    return {
        "_id": alert_id,
        "rule_id": rule.id,
        "rule_name": rule.name,
        "account": account,
        "visible_to": visible_to,
        "labels": labels,
        **instance_fields(rule, instance),
    }


def instance_fields(rule: Rule, instance: Instance) -> Doc:
    """What an evaluation changes of a stored alert."""
    return {
        "state": instance.state.value,
        "value": instance.value,
        "annotations": {
            k: render(v, instance.labels, instance.value) for k, v in rule.spec.annotations.items()
        },
        "started_at_ms": now_ms(instance.started_at),
        "fired_at_ms": None if instance.fired_at is None else now_ms(instance.fired_at),
        "resolved_at_ms": None if instance.resolved_at is None else now_ms(instance.resolved_at),
        "keep_firing_since_ms": (
            None if instance.keep_firing_since is None else now_ms(instance.keep_firing_since)
        ),
    }


def instance_of(doc: Doc) -> Instance:
    def at(key: str) -> datetime | None:
        return from_ms(doc.get(key))

    started = at("started_at_ms")
    assert started is not None
    return Instance(
        labels=dict(doc["labels"]),
        state=AlertState(doc["state"]),
        started_at=started,
        value=float(doc.get("value") or 0.0),
        fired_at=at("fired_at_ms"),
        resolved_at=at("resolved_at_ms"),
        keep_firing_since=at("keep_firing_since_ms"),
    )


def alert_view(doc: Doc) -> AlertView:
    fields: dict[str, Any] = {
        "id": doc["_id"],
        "rule_id": doc["rule_id"],
        "rule_name": doc["rule_name"],
        "state": doc["state"],
        "labels": doc.get("labels") or {},
        "annotations": doc.get("annotations") or {},
        "value": doc.get("value"),
        "started_at": from_ms(doc["started_at_ms"]),
        "fired_at": from_ms(doc.get("fired_at_ms")),
        "resolved_at": from_ms(doc.get("resolved_at_ms")),
        "account": doc.get("account"),
    }
    return AlertView.model_validate(fields)
