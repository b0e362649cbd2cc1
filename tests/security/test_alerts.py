"""Attack class 17: another account's alert rules and alerts (R-OPS-1, R-TEN-2).

The victim keeps a rule over its own nodes' series; the attacker tries to read, remove and
shadow it, to write a rule over the victim's series (a matcher naming the victim's account or
its nodes' owner, an `account` in the body, an operator's PromQL expression, the operators'
subject) and to put the victim's node into maintenance through a rule of its own."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from gpufleet_contracts import subjects

from .attack import Client
from .conftest import VICTIM_ACCOUNT, System, Victim, attacker_subject

HOT: dict[str, Any] = {
    "series": "gpufleet_gpu_temperature_celsius",
    "comparison": ">",
    "threshold": 85,
}


async def test_another_account_reaches_no_rule_or_alert_and_no_series_of_mine(
    system: System, victim: Victim, eve: Path
) -> None:
    name = f"hot-{uuid.uuid4().hex[:6]}"
    mine = await victim.request(
        "provisioner", "add_alert_rule", {"name": name, **HOT, "scope": "owner"}
    )
    assert f'owner="{VICTIM_ACCOUNT}"' in mine["query"], mine
    try:
        async with Client(system.nats.url, eve) as attacker:
            for verb in ("list_alert_rules", "list_alerts", "remove_alert_rule", "add_alert_rule"):
                victims = subjects.as_account(subjects.rpc("provisioner", verb), VICTIM_ACCOUNT)
                await attacker.request_refused(victims, {"rule": mine["id"], "name": "x", **HOT})
            await attacker.request_refused(
                subjects.admin("provisioner", "add_alert_rule"), {"name": "x", "expr": "up"}
            )

            async def ask(verb: str, body: dict[str, Any]) -> dict[str, Any]:
                reply: dict[str, Any] = await attacker.request(
                    attacker_subject("provisioner", verb), body
                )
                return reply

            rules = (await ask("list_alert_rules", {}))["rules"]
            assert [r for r in rules if not r["builtin"]] == []
            assert all(r["account"] is None for r in rules)  # the built-in ones only
            assert [a for a in (await ask("list_alerts", {}))["alerts"]] == []
            for ref in (mine["id"], name):
                gone = await ask("remove_alert_rule", {"rule": ref})
                assert gone["error"]["code"] == "not_found", gone
            for label, scope in (("account", "account"), ("owner", "owner")):
                matcher = {"label": label, "value": VICTIM_ACCOUNT}
                body = {"name": "spy", **HOT, "scope": scope, "matchers": [matcher]}
                spy = await ask("add_alert_rule", body)
                fields = [(f["field"], f["rule"]) for f in spy["error"]["fields"]]
                assert fields == [("matchers.0.label", "R-TEN-2")], spy
            expr = await ask("add_alert_rule", {"name": "spy", "expr": "gpufleet_node_up"})
            assert [f["field"] for f in expr["error"]["fields"]] == ["expr"], expr
            # a rule that would put a node into maintenance: only over its own nodes
            down = await ask("add_alert_rule", {"name": "down", **HOT, "maintenance": True})
            assert [f["field"] for f in down["error"]["fields"]] == ["maintenance"], down
            # an account in the body is not the acting account: the connection's is forced
            own = await ask("add_alert_rule", {"name": name, **HOT, "account": VICTIM_ACCOUNT})
            assert own["account"] != VICTIM_ACCOUNT, own
            assert f'account="{VICTIM_ACCOUNT}"' not in own["query"], own
            await ask("remove_alert_rule", {"rule": own["id"]})
    finally:
        listed = (await victim.request("provisioner", "list_alert_rules", {}))["rules"]
        assert [r["id"] for r in listed if r["name"] == name] == [mine["id"]]
        await victim.request("provisioner", "remove_alert_rule", {"rule": mine["id"]})
    await victim.assert_untouched()
