"""R-TEN-1: no tenant account may take a name the platform's ledger uses itself (L1)."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_billing.fees import EARNINGS_PREFIX, PLATFORM
from gpufleet_contracts import field_errors
from gpufleet_contracts.identity import (
    RESERVED_ACCOUNTS,
    AddUser,
    AdminIssueJoinToken,
    CreateAccount,
    RemoveAccount,
    SetPlan,
)
from pydantic import BaseModel, ValidationError

MODELS: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (CreateAccount, {}),
    (SetPlan, {"plan": "team"}),
    (AddUser, {"user": "alice"}),
    (AdminIssueJoinToken, {"minion_id": "m-1", "region": "east"}),
    (RemoveAccount, {}),
]


def test_billing_platform_account_is_reserved() -> None:
    assert PLATFORM in RESERVED_ACCOUNTS


@pytest.mark.parametrize(("model", "rest"), MODELS)
@pytest.mark.parametrize(
    "name", ["platform", "Platform", "_platform", "_x", f"{EARNINGS_PREFIX}bob", "a:b"]
)
def test_reserved_and_ledger_like_names_are_refused_naming_field_and_rule(
    model: type[BaseModel], rest: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValidationError) as info:
        model.model_validate({"account": name, **rest})
    errors = field_errors(info.value, model)
    assert [(e.field, e.rule) for e in errors] == [("account", "R-TEN-1")]
    assert errors[0].valid and "platform" in errors[0].valid


@pytest.mark.parametrize(("model", "rest"), MODELS)
def test_ordinary_names_are_accepted(model: type[BaseModel], rest: dict[str, Any]) -> None:
    assert model.model_validate({"account": "platform-team", **rest}).account == "platform-team"  # type: ignore[attr-defined]
