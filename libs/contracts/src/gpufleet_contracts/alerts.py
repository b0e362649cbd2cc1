"""Alert rules and alerts (R-OPS-1), in Prometheus's model: a rule is a series compared with a
threshold (or, an operator's, a PromQL expression), held `for_s` before it fires and kept
firing `keep_firing_for_s` after its condition is gone; each label set it matches is one alert.

An account's rules watch its own series only: the provisioner adds the account's matcher
(`account="<acting account>"`, or `owner=` for its nodes' series) to every rule it asks for,
and another account's rules and alerts are "not found". Operators add rules across accounts
on the admin subjects. Built-in rules are the operators'; an account sees them and their
alerts about its own series.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from . import limits, subjects
from .base import Command, Event
from .fields import Cap, Name

# Prometheus's names (https://prometheus.io/docs/concepts/data_model/).
SERIES_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
LABEL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
RULE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_DURATION_S = 7 * 24 * 3600  # a `for` or `keep_firing_for` of at most a week

Comparison = Literal[">", ">=", "<", "<=", "==", "!="]
MatchOp = Literal["=", "!=", "=~", "!~"]
LabelName = Annotated[str, Field(pattern=LABEL_PATTERN, max_length=64)]
LabelValue = Annotated[str, Cap(limits.ALERT_LABEL_CHARS, "alert_label_chars", "characters")]
AnnotationValue = Annotated[
    str, Cap(limits.ALERT_ANNOTATION_CHARS, "alert_annotation_chars", "characters")
]
Labels = Annotated[dict[LabelName, LabelValue], Cap(limits.ALERT_LABELS, "alert_labels", "labels")]
Annotations = Annotated[
    dict[LabelName, AnnotationValue], Cap(limits.ALERT_LABELS, "alert_annotations", "entries")
]
RuleName = Annotated[Name, Field(pattern=RULE_NAME_PATTERN)]
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)]


class AlertState(StrEnum):
    pending = "pending"  # its condition holds, not yet for `for_s`
    firing = "firing"
    resolved = "resolved"


class RuleScope(StrEnum):
    """Which label an account's rule is confined by: `account` (its jobs', costs' series) or
    `owner` (its nodes' series; another account's job on them is not named)."""

    account = "account"
    owner = "owner"


class Matcher(BaseModel):
    """One label matcher of a series, as PromQL writes it: `label op "value"`."""

    label: LabelName
    op: MatchOp = "="
    value: LabelValue


class AlertRuleSpec(BaseModel):
    """A rule as asked: `series` + `matchers` + `comparison` + `threshold`, or (operators
    only) `expr`, a PromQL expression whose every result is an alert."""

    name: RuleName
    series: str | None = Field(default=None, pattern=SERIES_PATTERN, max_length=200)
    matchers: Annotated[list[Matcher], Cap(limits.ALERT_MATCHERS, "alert_matchers", "matchers")] = (
        Field(default_factory=list)
    )
    comparison: Comparison | None = None
    threshold: float | None = Field(default=None, allow_inf_nan=False)
    expr: str | None = Field(default=None, min_length=1, max_length=limits.ALERT_EXPR_CHARS)
    for_s: Seconds = 0.0
    keep_firing_for_s: Seconds = 0.0
    labels: Labels = Field(default_factory=dict)
    annotations: Annotations = Field(default_factory=dict)
    scope: RuleScope = RuleScope.account
    # A firing alert that names a node (its `node` label, the minion id) puts that node into
    # maintenance, with the alert as the reason.
    maintenance: bool = False


class AlertRuleView(BaseModel):
    id: str
    name: str
    account: str | None  # None: an operator's rule (built-in ones too)
    builtin: bool = False
    query: str  # the PromQL evaluated, the account's matcher included
    series: str | None = None
    matchers: list[Matcher] = Field(default_factory=list)
    comparison: Comparison | None = None
    threshold: float | None = None
    expr: str | None = None
    for_s: float
    keep_firing_for_s: float
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    scope: RuleScope = RuleScope.account
    maintenance: bool = False
    created_at: datetime | None = None
    last_evaluated_at: datetime | None = None
    last_error: str | None = None  # the last evaluation's failure (the query's, Prometheus's)
    truncated: bool = False  # it matched more label sets than one rule may hold alerts


class AlertRuleList(BaseModel):
    rules: list[AlertRuleView]


class AlertRuleRemoved(BaseModel):
    id: str
    name: str
    removed: bool = True


class AlertView(BaseModel):
    id: str
    rule_id: str
    rule_name: str
    state: AlertState
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    value: float | None = None
    started_at: datetime  # its condition first held (Prometheus's activeAt)
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    account: str | None = None  # the account it is about (its rule's, or its series' own)


class AlertList(BaseModel):
    alerts: list[AlertView]


RuleRef = Annotated[str, Field(min_length=1, max_length=128)]
Limit = Annotated[int, Field(ge=1, le=1000)]


# --- an account's requests (rpc.provisioner.<verb>.<account>) ---------------------------------


class AddAlertRule(AlertRuleSpec, Command):
    """Add a rule over the acting account's own series (`series` + `comparison` +
    `threshold`; `expr` is the operators')."""

    TYPE = "gpufleet.alert.add_rule.v1"
    SUBJECT = subjects.rpc("provisioner", "add_alert_rule")
    REPLY = AlertRuleView


class ListAlertRules(Command):
    """The acting account's rules and the built-in ones."""

    READ = True

    TYPE = "gpufleet.alert.list_rules.v1"
    SUBJECT = subjects.rpc("provisioner", "list_alert_rules")
    REPLY = AlertRuleList


class RemoveAlertRule(Command):
    """Remove one of the acting account's rules (by id or name) and its alerts."""

    TYPE = "gpufleet.alert.remove_rule.v1"
    SUBJECT = subjects.rpc("provisioner", "remove_alert_rule")
    REPLY = AlertRuleRemoved
    rule: RuleRef


class ListAlerts(Command):
    """The acting account's alerts (its rules', and the built-in rules' about its series),
    newest first; `state` keeps those in that state."""

    READ = True

    TYPE = "gpufleet.alert.list.v1"
    SUBJECT = subjects.rpc("provisioner", "list_alerts")
    REPLY = AlertList
    state: AlertState | None = None
    limit: Limit = 100


# --- operators' requests (adm.provisioner.<verb>) ---------------------------------------------


class AddOperatorAlertRule(AlertRuleSpec, Command):
    """Add an operator's rule: across accounts, or a PromQL expression (`expr`)."""

    TYPE = "gpufleet.alert.add_operator_rule.v1"
    SUBJECT = subjects.admin("provisioner", "add_alert_rule")
    REPLY = AlertRuleView


class ListAllAlertRules(Command):
    """Every rule: the operators', the built-in ones and every account's (`account`: that
    account's only)."""

    READ = True

    TYPE = "gpufleet.alert.list_all_rules.v1"
    SUBJECT = subjects.admin("provisioner", "list_alert_rules")
    REPLY = AlertRuleList
    account: str | None = Field(default=None, pattern=subjects.ACCOUNT_RE.pattern)


class RemoveOperatorAlertRule(Command):
    """Remove any rule but a built-in one, by id (an operator's also by name)."""

    TYPE = "gpufleet.alert.remove_operator_rule.v1"
    SUBJECT = subjects.admin("provisioner", "remove_alert_rule")
    REPLY = AlertRuleRemoved
    rule: RuleRef


class ListAllAlerts(Command):
    """Every account's alerts, newest first; `state`, `account` narrow them."""

    READ = True

    TYPE = "gpufleet.alert.list_all.v1"
    SUBJECT = subjects.admin("provisioner", "list_alerts")
    REPLY = AlertList
    state: AlertState | None = None
    account: str | None = Field(default=None, pattern=subjects.ACCOUNT_RE.pattern)
    limit: Limit = 100


# --- events ------------------------------------------------------------------------------------


class AlertFired(Event):
    """An alert began firing: its condition held for its rule's `for_s`."""

    TYPE = "gpufleet.alert.fired.v1"
    SUBJECT = subjects.event("alert", "fired")
    alert: AlertView


class AlertResolved(Event):
    """A firing alert's condition is gone (and stayed gone its rule's `keep_firing_for_s`)."""

    TYPE = "gpufleet.alert.resolved.v1"
    SUBJECT = subjects.event("alert", "resolved")
    alert: AlertView
