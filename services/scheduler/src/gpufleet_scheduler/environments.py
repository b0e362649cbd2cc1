"""The base environments the fleet offers (R-JOB-7): a node document's offer, the filters
of the nodes that offer a triple, and the refusal of a submission whose triple no node offers.
Pure (admission.py reads the nodes).

What "no node offers" means: no node that is not removed (in the job's pinned region, if it
has one) offers it, counting a node whose agent announced nothing (older than the
announcement) as offering what every gpufleet node builds, `BUILT_IN`; and a fleet (or a
pinned region) without nodes is judged by `BUILT_IN` too, so a first job is not refused
before any node joins. The owner, GPU types, state, price and verification are not looked
at: they change, or another node may come; a job that passes but fits no node for them
waits with its reason (placement's `no_environment`).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet_contracts.environments import (
    BUILT_IN,
    EnvironmentOffer,
    buildable_version,
    describe,
    distinct,
    tag_of,
    unoffered_field,
)
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.jobspec import BaseEnvironment
from gpufleet_store import Doc

_OFFERS: dict[tuple[tuple[str, ...], ...], EnvironmentOffer] = {}  # interned: nodes share them


def offer_of(value: Doc | None) -> EnvironmentOffer:
    """A node document's `environments` (lifecycle.py writes it from NodeRegistered); None,
    a node whose agent announced none: `BUILT_IN`."""
    if not value:
        return BUILT_IN
    key = tuple(tuple(value.get(k) or ()) for k in ("python_versions", "frameworks", "mapped"))
    found = _OFFERS.get(key)
    if found is None:
        found = EnvironmentOffer.model_validate(value)
        if len(_OFFERS) < 10_000:
            _OFFERS[key] = found
    return found


def stored(offer: EnvironmentOffer | None) -> Doc | None:
    """The node document's form of `offer` (None: its agent announced none)."""
    return None if offer is None else offer.model_dump(mode="json")


def offering(base: BaseEnvironment) -> list[Doc]:
    """Filters of the node documents that offer `base` (a node matches one of them exactly
    when `offer_of(...).offers(base)`): the nodes that build it, those whose agent announced
    nothing (when every node builds it), those that map its tag. Asked one at a time, in
    that order: the store (nx-27017) reads every node for a `$or` of them, where the first
    alone usually stops at the first node (scheduler README, "Base environments")."""
    filters: list[Doc] = []
    if buildable_version(base.framework.value, base.framework_version):
        filters.append(
            {
                "environments.python_versions": base.python_version,
                "environments.frameworks": base.framework.value,
            }
        )
    if BUILT_IN.offers(base):
        filters.append({"environments": None})  # null or absent: an agent that announced none
    filters.append({"environments.mapped": tag_of(base)})
    return filters


def fleet_offers(stored_offers: Iterable[Doc | None]) -> list[EnvironmentOffer]:
    """The distinct offers of these node documents' `environments`; none at all: `BUILT_IN`."""
    return distinct(offer_of(s) for s in stored_offers) or [BUILT_IN]


def refusal(
    base: BaseEnvironment, offers: list[EnvironmentOffer], region: str | None
) -> Refused | None:
    """Why `base` is refused (None: some offer has it), naming the environment's field."""
    if any(o.offers(base) for o in offers):
        return None
    field = unoffered_field(offers, base)
    where = f"in region {region} " if region is not None else ""
    what = {
        "python_version": f"Python {base.python_version}",
        "framework": f"{base.framework.value} with Python {base.python_version}",
        "framework_version": f"{base.framework.value} {base.framework_version or '(no version)'}"
        f" with Python {base.python_version} ({tag_of(base)})",
    }[field]
    return Refused.of_field(
        "invalid",
        f"no node {where}offers a base environment for {what}: the job would never start",
        field=f"spec.environment.{field}",
        rule="R-JOB-7",
        says=f"no node {where}offers a base environment for {what}",
        valid=describe(offers),
    )
