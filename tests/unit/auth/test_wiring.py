"""Agreement: what each service's wiring subscribes to and publishes, its credential allows.

The wiring (each composition root) and the permission table (gpufleet_auth.permissions) are
written apart; this reads every subject from the apps' AsyncAPI documents, as `just docs`
does, and checks each against the service's own row. A subject added to a service without
its permission fails here, not in production.
"""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_auth import permissions
from gpufleet_bus.streams import stream_for
from gpufleet_devstack import docs

INBOX = "_INBOX.UKEY"
MINION = "MINION_ID"  # the docs build the node agent with this minion id


def _operations(doc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for op in doc.get("operations", {}).values():
        channel = doc["channels"][op["channel"]["$ref"].rsplit("/", 1)[-1]]
        out.append((op["action"], channel["address"]))
    return out


def _literal(address: str) -> str:
    """A subject the address stands for: the node's own minion id, an account `acme`."""
    address = address.replace("{minion_id}", MINION).replace("{account}", "acme")
    return ".".join("acme" if t == "*" else t for t in address.split("."))


class Documents(dict[str, dict[str, Any]]):
    """Each service's AsyncAPI document, built when first asked for."""

    def __missing__(self, name: str) -> dict[str, Any]:
        self[name] = docs.asyncapi(docs._apps()[name]())
        return self[name]


@pytest.fixture(scope="module")
def documents() -> dict[str, dict[str, Any]]:
    return Documents()


@pytest.mark.parametrize("service", [*permissions.SERVICES, "node-agent", "device-agent"])
def test_every_subject_of_the_wiring_is_allowed(
    documents: dict[str, dict[str, Any]], service: str
) -> None:
    grant = (
        permissions.for_node(MINION, INBOX)
        if service == "node-agent"
        else permissions.for_device(MINION, INBOX)
        if service == "device-agent"
        else permissions.for_service(service, INBOX)
    )
    refused = []
    for action, address in _operations(documents[service]):
        subject = _literal(address)
        stream = stream_for(subject)
        if action == "send":
            ok = grant.may_publish(subject)
        elif stream is None:
            ok = grant.may_subscribe(address)
        elif service in ("node-agent", "device-agent"):
            ok = grant.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.node-{MINION}")
        else:
            ok = grant.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{service}-x")
        if not ok:
            refused.append(f"{action} {address}")
    assert refused == [], f"{service}'s credential does not allow: {refused}"


def test_a_service_gets_no_other_service_s_requests() -> None:
    billing = permissions.for_service("billing", INBOX)
    assert not billing.may_subscribe("gpufleet.v1.rpc.scheduler.submit_job.*")
    assert not billing.may_subscribe("gpufleet.v1.enroll.*")
