"""Alert rules and alerts as accounts and operators ask for them (R-OPS-1, R-TEN-2).

An account's requests act for the account of the connection: its rule is checked and
compiled with its own matcher (rules.py), and it reads its own rules, the built-in ones, and
the alerts about its series; any other rule or alert is "not found". Operators' requests
(the admin subjects) see and remove every rule but the built-in ones.
"""

from __future__ import annotations

import uuid

from gpufleet_contracts.alerts import (
    AddAlertRule,
    AddOperatorAlertRule,
    AlertList,
    AlertRuleList,
    AlertRuleRemoved,
    AlertRuleSpec,
    AlertRuleView,
    ListAlertRules,
    ListAlerts,
    ListAllAlertRules,
    ListAllAlerts,
    RemoveAlertRule,
    RemoveOperatorAlertRule,
)
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_store import Doc

from .book import AlertBook
from .prometheus import BadQuery, Prometheus
from .rules import check, compile_query
from .views import SPEC_FIELDS, Rule, alert_view, rule_view


def spec_of(body: AddAlertRule | AddOperatorAlertRule) -> AlertRuleSpec:
    return AlertRuleSpec.model_validate(body.model_dump(include=set(SPEC_FIELDS)))


class AlertRequests:
    def __init__(
        self, book: AlertBook, builtin: list[Rule], clock: Clock, prometheus: Prometheus | None
    ) -> None:
        self.book = book
        self.builtin = builtin
        self.clock = clock
        self.prometheus = prometheus

    # --- an account's --------------------------------------------------------------------

    async def add_alert_rule(self, body: AddAlertRule, account: str) -> AlertRuleView:
        """A rule over the acting account's own series."""
        return await self._add(spec_of(body), account)

    async def list_alert_rules(self, body: ListAlertRules, account: str) -> AlertRuleList:
        return await self._views([*self.builtin, *await self.book.rules(account)])

    async def remove_alert_rule(self, body: RemoveAlertRule, account: str) -> AlertRuleRemoved:
        return await self._remove(await self._find(body.rule, account))

    async def list_alerts(self, body: ListAlerts, account: str) -> AlertList:
        """The alerts about the acting account's series, newest first."""
        return await self._alerts({"visible_to": account}, body.state, body.limit)

    # --- the operators' ------------------------------------------------------------------

    async def add_operator_rule(self, body: AddOperatorAlertRule) -> AlertRuleView:
        """An operator's rule: across accounts, or a PromQL expression."""
        return await self._add(spec_of(body), None)

    async def list_all_rules(self, body: ListAllAlertRules) -> AlertRuleList:
        rules = await self.book.rules(body.account)
        return await self._views(rules if body.account else [*self.builtin, *rules])

    async def remove_operator_rule(self, body: RemoveOperatorAlertRule) -> AlertRuleRemoved:
        return await self._remove(await self._find(body.rule, None, any_account=True))

    async def list_all_alerts(self, body: ListAllAlerts) -> AlertList:
        return await self._alerts(
            {} if body.account is None else {"visible_to": body.account}, body.state, body.limit
        )

    # --- shared --------------------------------------------------------------------------

    async def _add(self, spec: AlertRuleSpec, account: str | None) -> AlertRuleView:
        check(spec, account)
        query = compile_query(spec, account)
        if spec.expr is not None and self.prometheus is not None:
            try:
                await self.prometheus.check(query)
            except BadQuery as exc:
                raise Refused.of_field(
                    "invalid",
                    f"expr: Prometheus refuses it: {exc}",
                    field="expr",
                    rule="R-OPS-1",
                    says=str(exc)[:500],
                    valid="a PromQL expression giving an instant vector",
                ) from None
        rule = Rule(f"rule-{uuid.uuid4().hex[:12]}", account, spec, query, False, self.clock())
        await self.book.add_rule(rule)
        return rule_view(rule)

    async def _find(self, ref: str, account: str | None, any_account: bool = False) -> Rule:
        try:
            return await self.book.rule(ref, account, any_account=any_account)
        except NotFound:
            if any(ref in (r.id, r.name) for r in self.builtin):
                raise Refused(
                    "conflict", f"{ref!r} is a built-in rule: it cannot be removed (R-OPS-1)"
                ) from None
            raise

    async def _remove(self, rule: Rule) -> AlertRuleRemoved:
        await self.book.remove_rule(rule)
        return AlertRuleRemoved(id=rule.id, name=rule.name)

    async def _views(self, rules: list[Rule]) -> AlertRuleList:
        status = await self.book.statuses([r.id for r in rules])
        return AlertRuleList(rules=[rule_view(r, status.get(r.id)) for r in rules])

    async def _alerts(self, query: Doc, state: object, limit: int) -> AlertList:
        if state is not None:
            query = {**query, "state": str(state)}
        docs = await self.book.alerts(query, limit)
        return AlertList(alerts=[alert_view(d) for d in docs])
