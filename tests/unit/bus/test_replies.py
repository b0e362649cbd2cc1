"""Agreement: every request a service serves names its reply model, and its handler returns it.

Each request model (a `Command`) says what answers it (`REPLY`); the handler wired to it in
each composition root is annotated to return that model (or a subclass: a node agent's
health is a Health). This walks every request, operator's request and direct subject of
every service's wiring table, as `just docs` builds them: a handler answering a raw document
fails here.
"""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
from gpufleet_contracts.base import Command
from gpufleet_devstack import docs
from pydantic import BaseModel

SERVICES = list(docs._services())


def _routes(service: str) -> list[Any]:
    return list(docs._services()[service]().runtime.requests.routes)


@pytest.mark.parametrize("service", SERVICES)
def test_each_request_names_its_reply_and_its_handler_returns_it(service: str) -> None:
    wrong = []
    for route in _routes(service):
        model, handler = route.model, route.handler
        reply = model.REPLY if issubclass(model, Command) else None
        returns = get_type_hints(handler).get("return")
        if not (isinstance(reply, type) and issubclass(reply, BaseModel)):
            wrong.append(f"{route.subject}: {model.__name__} names no reply model")
        elif not (isinstance(returns, type) and issubclass(returns, reply)):
            wrong.append(
                f"{route.subject}: {handler.__qualname__} returns {returns!r}, "
                f"not {model.__name__}'s reply {reply.__name__}"
            )
    assert wrong == []


def test_every_service_is_walked() -> None:
    """The walk sees each table (health and dead letters at least: none is skipped)."""
    assert {"scheduler", "provisioner", "billing", "datastore", "node-agent"} <= set(SERVICES)
    for service in SERVICES:
        assert _routes(service), service
