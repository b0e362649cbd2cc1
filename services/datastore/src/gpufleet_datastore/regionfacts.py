"""What a regional resource's region must be, asked of the services that know it: the
provisioner (the region by its owner's id, its compute nodes, the owner's plan) and, where
it has no compute node, device-fleet (its devices). Touches the bus."""

from __future__ import annotations

from gpufleet_bus.ask import Asker
from gpufleet_contracts.datastores import GetRegionFacts, RegionFacts
from gpufleet_contracts.devices import CountRegionDevices, RegionDevices

from .shares import check_region


async def checked_region(ask: Asker, account: str, region: str) -> RegionFacts:
    """`account`'s region `region`, refused unless it may hold regional resources (R-TEN-3,
    R-RES-1: at least one compute node or device)."""
    facts = await ask(GetRegionFacts(owner=account, region=region), RegionFacts)
    devices = 0
    if facts.compute_nodes == 0:
        counted = await ask(CountRegionDevices(region_id=facts.region_id), RegionDevices)
        devices = counted.devices
    check_region(facts, devices, region)
    return facts
