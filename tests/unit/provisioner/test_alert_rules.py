"""Alert rules as data: validation (every field at fault named), the PromQL they compile to
with the account's matcher forced by the server, and the built-in rules."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts.alerts import AddAlertRule, AlertRuleSpec, Matcher, RuleScope
from gpufleet_contracts.errors import Refused
from gpufleet_provisioner.alerts.builtin import builtin_rules
from gpufleet_provisioner.alerts.rules import check, compile_query, problems, render
from pydantic import ValidationError

HOT: dict[str, Any] = {
    "name": "hot",
    "series": "gpufleet_gpu_temperature_celsius",
    "comparison": ">",
    "threshold": 85,
}


def spec(**kw: Any) -> AlertRuleSpec:
    return AlertRuleSpec.model_validate({**HOT, **kw})


def fields(s: AlertRuleSpec, account: str | None = "acme") -> dict[str, str]:
    return {f.field: f.rule for f in problems(s, account)}


def test_an_accounts_rule_is_confined_to_its_own_series() -> None:
    assert compile_query(spec(), "acme") == (
        'gpufleet_gpu_temperature_celsius{account="acme"} > 85.0'
    )
    with_matchers = spec(
        matchers=[{"label": "gpu", "value": "0"}, {"label": "node", "op": "=~", "value": "n.*"}]
    )
    assert compile_query(with_matchers, "acme") == (
        'gpufleet_gpu_temperature_celsius{gpu="0",node=~"n.*",account="acme"} > 85.0'
    )


def test_owner_scope_hides_whose_work_runs_on_the_node() -> None:
    q = compile_query(spec(scope="owner", comparison="<=", threshold=0.5), "acme")
    assert q == (
        'max without (account, job) (gpufleet_gpu_temperature_celsius{owner="acme"}) <= 0.5'
    )


def test_an_operators_rule_spans_accounts_and_may_be_an_expression() -> None:
    assert compile_query(spec(), None) == "gpufleet_gpu_temperature_celsius > 85.0"
    expr = spec(series=None, comparison=None, threshold=None, expr="up == 0")
    check(expr, None)
    assert compile_query(expr, None) == "up == 0"


def test_values_are_quoted_as_promql_strings() -> None:
    s = spec(matchers=[{"label": "gpu", "value": 'a"} or vector(1) #\n'}])
    q = compile_query(s, "acme")
    assert q.startswith('gpufleet_gpu_temperature_celsius{gpu="a\\"} or vector(1) #\\n",')
    assert q.endswith('account="acme"} > 85.0')


def test_an_account_cannot_write_an_expression() -> None:
    assert fields(spec(series=None, comparison=None, threshold=None, expr="up")) == {
        "expr": "R-TEN-2"
    }


def test_an_account_cannot_scope_a_rule_to_another_account() -> None:
    for label in ("account", "owner"):
        s = spec(matchers=[{"label": label, "value": "other"}])
        assert fields(s) == {"matchers.0.label": "R-TEN-2"}
        assert fields(s, None) == {}  # an operator may narrow to an account


def test_every_missing_or_conflicting_field_is_named() -> None:
    assert set(fields(spec(series=None, comparison=None, threshold=None))) == {
        "series",
        "comparison",
        "threshold",
    }
    assert set(fields(spec(expr="up"), None)) == {"series", "comparison", "threshold"}
    assert set(fields(spec(labels={"alertname": "x", "account": "b", "team": "ok"}))) == {
        "labels.alertname",
        "labels.account",
    }
    assert set(fields(spec(matchers=[{"label": "gpu", "op": "=~", "value": "("}]))) == {
        "matchers.0.value"
    }
    assert fields(spec(maintenance=True)) == {"maintenance": "R-TEN-2"}
    assert fields(spec(maintenance=True, scope=RuleScope.owner)) == {}
    with pytest.raises(Refused) as refused:
        check(spec(series=None), "acme")
    assert refused.value.code == "invalid" and refused.value.fields[0].field == "series"


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "has space"},
        {"series": "not-a-metric"},
        {"comparison": "=~"},
        {"threshold": float("nan")},
        {"for_s": -1},
        {"keep_firing_for_s": 8 * 86400},
        {"matchers": [{"label": "0bad", "value": "x"}]},
        {"matchers": [{"label": "gpu", "value": "x"}] * 17},
        {"labels": {f"l{i}": "v" for i in range(17)}},
        {"annotations": {"summary": "x" * 2000}},
    ],
)
def test_the_schema_refuses_what_no_rule_may_hold(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        AddAlertRule.model_validate({**HOT, **bad})


def test_templates_fill_labels_and_value() -> None:
    text = "GPU {{ $labels.gpu }} of {{$labels.node}} at {{ $value }} °C {{ $labels.none }}"
    assert render(text, {"gpu": "0", "node": "n1"}, 91.5) == "GPU 0 of n1 at 91.5 °C "


def test_builtin_rules_compile_and_check() -> None:
    rules = {r.id: r for r in builtin_rules()}
    assert set(rules) == {
        "builtin-gpu-xid",
        "builtin-gpu-ecc-uncorrected",
        "builtin-gpu-temperature",
        "builtin-node-heartbeat",
        "builtin-billed-gpu-idle",
    }
    for r in rules.values():
        check(r.spec, None)
    assert rules["builtin-gpu-xid"].spec.maintenance
    assert rules["builtin-gpu-ecc-uncorrected"].spec.maintenance
    assert not builtin_rules(maintenance=False)[0].spec.maintenance
    idle = rules["builtin-billed-gpu-idle"].spec
    assert compile_query(idle, None) == 'gpufleet_gpu_utilization_percent{job!=""} < 5.0'
    assert idle.for_s == 1800
    assert compile_query(rules["builtin-node-heartbeat"].spec, None) == "gpufleet_node_up == 0.0"
    assert Matcher(label="job", op="!=", value="") in idle.matchers
