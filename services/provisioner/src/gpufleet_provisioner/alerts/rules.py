"""Alert rules as plain data: who may say what in a rule, and the PromQL it is evaluated as.

An account's rule is a series, label matchers, a comparison and a threshold; the account's
own matcher is added here, never taken from the rule: `account="<acting account>"`, or
`owner=` for its nodes' series, where the other labels that name an account's work (`account`,
`job`) are aggregated away so a node's owner learns nothing of who runs on it. An operator's
rule may be a PromQL expression, or a series across accounts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from gpufleet_contracts.alerts import AlertRuleSpec, RuleScope
from gpufleet_contracts.errors import FieldError, Refused

# Labels the server sets: an account's matcher, and the alert's own name.
SCOPE_LABELS = ("account", "owner")
RESERVED_LABELS = frozenset({*SCOPE_LABELS, "alertname"})
# What an owner-scoped rule hides of its nodes' series: whose work runs there.
HIDDEN_FROM_OWNER = ("account", "job")
RULE = "R-OPS-1"
TENANCY = "R-TEN-2"


def quote(value: str) -> str:
    """A PromQL string literal (Go's escapes, which JSON's are a subset of)."""
    return json.dumps(value, ensure_ascii=False)


def problems(spec: AlertRuleSpec, account: str | None) -> list[FieldError]:
    """What is wrong with `spec` asked by `account` (None: an operator), field by field."""
    out: list[FieldError] = []

    def bad(field: str, message: str, valid: str, rule: str = RULE) -> None:
        out.append(FieldError(field=field, rule=rule, message=message, valid=valid))

    simple = ("series", "comparison", "threshold")
    if spec.expr is not None:
        if account is not None:
            bad(
                "expr",
                "a PromQL expression is an operator's rule",
                "series, comparison and threshold",
                TENANCY,
            )
        for name in simple:
            if getattr(spec, name) is not None:
                bad(name, "a rule is an expression or a series comparison, not both", "one")
        if spec.matchers:
            bad("matchers", "matchers belong to a series, not an expression", "none")
    else:
        for name in simple:
            if getattr(spec, name) is None:
                bad(name, "missing: a rule without `expr` compares a series", f"a {name}")
    for i, m in enumerate(spec.matchers):
        if account is not None and m.label in SCOPE_LABELS:
            bad(
                f"matchers.{i}.label",
                "an account's rule is confined to its own series by the server",
                "a label other than account or owner",
                TENANCY,
            )
        if m.op in ("=~", "!~"):
            try:
                re.compile(m.value)
            except re.error as exc:
                bad(f"matchers.{i}.value", f"not a regular expression: {exc}", "an RE2 regex")
    for key in spec.labels:
        if key in RESERVED_LABELS:
            bad(
                f"labels.{key}",
                "set by the server",
                "a label other than " + ", ".join(sorted(RESERVED_LABELS)),
            )
    if spec.maintenance and account is not None and spec.scope is not RuleScope.owner:
        bad(
            "maintenance",
            "only a rule over the account's own nodes (scope owner) may put a node into "
            "maintenance",
            "scope owner",
            TENANCY,
        )
    return out


def check(spec: AlertRuleSpec, account: str | None) -> None:
    """Refuse `spec` (every field at fault named) unless `account` may add it."""
    found = problems(spec, account)
    if found:
        raise Refused("invalid", "; ".join(f"{f.field}: {f.message}" for f in found), found)


def selector(spec: AlertRuleSpec, account: str | None) -> str:
    """`series{matchers}`, with the account's own matcher when `account` is given."""
    parts = [f"{m.label}{m.op}{quote(m.value)}" for m in spec.matchers]
    if account is not None:
        parts.append(f"{spec.scope.value}={quote(account)}")
    return f"{spec.series}{{{','.join(parts)}}}" if parts else str(spec.series)


def compile_query(spec: AlertRuleSpec, account: str | None) -> str:
    """The PromQL of a checked rule; `account`: the account it belongs to (None: an
    operator's, evaluated across accounts)."""
    if spec.expr is not None:
        return spec.expr
    series = selector(spec, account)
    if account is not None and spec.scope is RuleScope.owner:
        series = f"max without ({', '.join(HIDDEN_FROM_OWNER)}) ({series})"
    return f"{series} {spec.comparison} {spec.threshold!r}"


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.([a-zA-Z_][a-zA-Z0-9_]*)|value)\s*\}\}")


def render(template: str, labels: Mapping[str, str], value: float | None) -> str:
    """`{{ $labels.x }}` and `{{ $value }}` filled in (what else a template says is kept)."""

    def one(m: re.Match[str]) -> str:
        if m.group(2) is not None:
            return labels.get(m.group(2), "")
        return "" if value is None else f"{value:g}"

    return _TEMPLATE.sub(one, template)
