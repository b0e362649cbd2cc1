"""`gpufleet alert rule add|list|remove` and `gpufleet alert list`: alert rules over your
account's series, in Prometheus's model, and the alerts they fire (R-OPS-1). Operators add
rules across accounts or as PromQL expressions with `--operator`, and see every account's
with `--all-accounts`."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer
from gpufleet_contracts.alerts import (
    AddAlertRule,
    AddOperatorAlertRule,
    ListAlertRules,
    ListAlerts,
    ListAllAlertRules,
    ListAllAlerts,
    RemoveAlertRule,
    RemoveOperatorAlertRule,
)

from . import client, render
from .client import CliError
from .common import JsonFlag
from .views import Col, Step, fitted

app = typer.Typer(help="Alerts fired by alert rules over your series.", no_args_is_help=True)
rule_app = typer.Typer(
    help=(
        "Alert rules: a series compared with a threshold, held --for a while before it fires "
        "(operators: any PromQL expression, --expr). Each label set that matches is one alert; "
        "AlertFired and AlertResolved are published as it fires and resolves."
    ),
    no_args_is_help=True,
)
app.add_typer(rule_app, name="rule")

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
MATCHER = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)(.*)$")

Operator = Annotated[
    bool, typer.Option("--operator", help="Operators: a rule of the installation's own.")
]
AllAccounts = Annotated[
    bool, typer.Option("--all-accounts", help="Operators: every account's, with their account.")
]


def seconds(value: str, option: str) -> float:
    """`90`, `30s`, `5m`, `1h30m`, `1d` as seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    if not value or DURATION.sub("", value):
        raise CliError(f"{option}: {value!r} is not a duration (e.g. 30s, 5m, 1h30m)", "invalid")
    return sum(float(n) * UNITS[u] for n, u in DURATION.findall(value))


def pairs(values: list[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep:
            raise CliError(f"{option}: {v!r} is not KEY=VALUE", "invalid")
        out[key] = val
    return out


def matchers(values: list[str]) -> list[dict[str, str]]:
    out = []
    for v in values:
        m = MATCHER.match(v)
        if m is None:
            raise CliError(f"--match: {v!r} is not LABEL=VALUE (or !=, =~, !~)", "invalid")
        out.append({"label": m.group(1), "op": m.group(2), "value": m.group(3)})
    return out


def _operators_only(exc: CliError, option: str) -> CliError:
    if exc.code == "forbidden":
        return CliError(f"{option} is for operators: this credential is a user's", exc.code)
    return exc


def ask(
    subject: str, body: dict[str, Any], as_json: bool, option: str | None, *, read: bool = False
) -> dict[str, Any]:
    """The reply to `body` (printed as is with --json); `option`: the operators' flag that
    chose an admin subject, named when a user's credential may not ask it."""
    with render.reported(as_json):
        try:
            reply = client.request(subject, json.dumps(body).encode(), retry=read)
        except CliError as exc:
            raise (exc if option is None else _operators_only(exc, option)) from None
    if as_json:
        render.emit_json(reply)
    return reply


@rule_app.command("add")
def rule_add(
    name: Annotated[str, typer.Argument(help="The rule's name (letters, digits, . _ -).")],
    series: Annotated[str | None, typer.Option(help="The series (metric name).")] = None,
    match: Annotated[
        list[str] | None, typer.Option("--match", help="A label matcher: LABEL=VALUE, !=, =~, !~.")
    ] = None,
    compare: Annotated[str | None, typer.Option("--compare", help="> >= < <= == !=")] = None,
    threshold: Annotated[float | None, typer.Option(help="The value compared with.")] = None,
    expr: Annotated[
        str | None, typer.Option(help="Operators: a PromQL expression instead of a series.")
    ] = None,
    for_: Annotated[
        str, typer.Option("--for", help="How long it holds before firing (30s, 5m).")
    ] = "0",
    keep_firing_for: Annotated[
        str, typer.Option(help="How long it keeps firing once its condition is gone.")
    ] = "0",
    label: Annotated[
        list[str] | None, typer.Option("--label", help="KEY=VALUE added to its alerts.")
    ] = None,
    annotation: Annotated[
        list[str] | None,
        typer.Option(
            "--annotation", help="KEY=VALUE; {{ $labels.x }} and {{ $value }} are filled in."
        ),
    ] = None,
    scope: Annotated[
        str,
        typer.Option(help="account: your jobs' and costs' series; owner: your nodes' series."),
    ] = "account",
    maintenance: Annotated[
        bool,
        typer.Option("--maintenance", help="A firing alert puts its node into maintenance."),
    ] = False,
    operator: Operator = False,
    as_json: JsonFlag = False,
) -> None:
    """Add an alert rule, e.g. `alert rule add hot --series gpufleet_gpu_temperature_celsius
    --compare '>' --threshold 85 --for 5m`."""
    with render.reported(as_json):
        body: dict[str, Any] = {
            "name": name,
            "series": series,
            "matchers": matchers(match or []),
            "comparison": compare,
            "threshold": threshold,
            "expr": expr,
            "for_s": seconds(for_, "--for"),
            "keep_firing_for_s": seconds(keep_firing_for, "--keep-firing-for"),
            "labels": pairs(label or [], "--label"),
            "annotations": pairs(annotation or [], "--annotation"),
            "scope": scope,
            "maintenance": maintenance,
        }
    subject = AddOperatorAlertRule.SUBJECT if operator else AddAlertRule.SUBJECT
    rule = ask(subject, body, as_json, "--operator" if operator else None)
    if not as_json:
        render.out().print(
            f"added rule [bold]{render.text(rule.get('name'))}[/] ({render.text(rule.get('id'))}):"
            f" {render.text(rule.get('query'))}"
        )


RULE_STEPS: list[Step] = [("drop", "Labels"), ("drop", "Account"), ("cut", "Query")]


def rules_table(rules: list[dict[str, Any]], width: int) -> Any:
    cols = [
        Col("Id", [render.text(r.get("id")) for r in rules]),
        Col("Name", [render.text(r.get("name")) for r in rules]),
        Col("Account", [render.text(r.get("account") or "(operators)") for r in rules]),
        Col("Query", [render.text(r.get("query")) for r in rules], floor=20),
        Col("For", [render.duration(r.get("for_s")) for r in rules]),
        Col("Labels", [render.text(_labels(r.get("labels"))) for r in rules]),
        Col("Status", [render.text(r.get("last_error") or "ok") for r in rules]),
    ]
    return fitted(cols, RULE_STEPS, width)


def _labels(labels: Any) -> str:
    if not isinstance(labels, dict):
        return ""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@rule_app.command("list")
def rule_list(
    all_accounts: AllAccounts = False,
    account: Annotated[
        str | None, typer.Option(help="With --all-accounts: this account's only.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Your rules and the built-in ones (operators: every rule, --all-accounts)."""
    if all_accounts:
        body = {} if account is None else {"account": account}
        reply = ask(ListAllAlertRules.SUBJECT, body, as_json, "--all-accounts", read=True)
    else:
        reply = ask(ListAlertRules.SUBJECT, {}, as_json, None, read=True)
    if as_json:
        return
    rules = [r for r in reply.get("rules") or [] if isinstance(r, dict)]
    console = render.out()
    console.print(rules_table(rules, console.width) if rules else "no alert rules")


@rule_app.command("remove")
def rule_remove(
    rule: Annotated[str, typer.Argument(help="The rule's id or name.")],
    operator: Operator = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove a rule and its alerts (a firing one resolves)."""
    subject = RemoveOperatorAlertRule.SUBJECT if operator else RemoveAlertRule.SUBJECT
    reply = ask(subject, {"rule": rule}, as_json, "--operator" if operator else None)
    if not as_json:
        render.out().print(f"removed rule [bold]{render.text(reply.get('name'))}[/]")


ALERT_STEPS: list[Step] = [("drop", "Account"), ("short", "Since"), ("cut", "Labels")]


def alerts_table(alerts: list[dict[str, Any]], width: int) -> Any:
    cols = [
        Col("State", [render.text(a.get("state")) for a in alerts]),
        Col("Rule", [render.text(a.get("rule_name")) for a in alerts]),
        Col("Account", [render.text(a.get("account")) for a in alerts]),
        Col("Value", [render.text(a.get("value")) for a in alerts], justify="right"),
        Col(
            "Since",
            [render.when(a.get("fired_at") or a.get("started_at")) for a in alerts],
            short=[
                render.when(a.get("fired_at") or a.get("started_at"), short=True) for a in alerts
            ],
        ),
        Col("Labels", [render.text(_labels(a.get("labels"))) for a in alerts], floor=20),
    ]
    return fitted(cols, ALERT_STEPS, width)


@app.command("list")
def alert_list(
    state: Annotated[
        str | None, typer.Option(help="Only those in this state: pending, firing, resolved.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 100,
    all_accounts: AllAccounts = False,
    as_json: JsonFlag = False,
) -> None:
    """Your alerts (and the built-in rules' about your series), newest first."""
    body: dict[str, Any] = {"limit": limit, **({"state": state} if state else {})}
    if all_accounts:
        reply = ask(ListAllAlerts.SUBJECT, body, as_json, "--all-accounts", read=True)
    else:
        reply = ask(ListAlerts.SUBJECT, body, as_json, None, read=True)
    if as_json:
        return
    alerts = [a for a in reply.get("alerts") or [] if isinstance(a, dict)]
    console = render.out()
    console.print(alerts_table(alerts, console.width) if alerts else "no alerts")
