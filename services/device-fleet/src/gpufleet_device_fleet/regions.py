"""What device-fleet asks the provisioner (svc.provisioner.<verb>, which only device-fleet may
publish): a region's facts by its owner's id for it, and a device's join token."""

from __future__ import annotations

from typing import Protocol

from faststream.nats import NatsBroker
from gpufleet_bus.ask import ask
from gpufleet_contracts.datastores import GetRegionFacts, RegionFacts
from gpufleet_contracts.devices import IssueDeviceJoinToken
from gpufleet_contracts.identity import JoinTokenIssued


class RegionPort(Protocol):
    async def facts(self, account: str, region: str) -> RegionFacts: ...

    async def join_token(
        self, account: str, minion_id: str, region: str, ttl_s: int
    ) -> JoinTokenIssued: ...


class Provisioner:
    """The provisioner over the bus: a refusal comes back as the Refused it was (NotFound:
    `account` has no such region)."""

    def __init__(self, broker: NatsBroker) -> None:
        self.broker = broker

    async def facts(self, account: str, region: str) -> RegionFacts:
        return await ask(self.broker, GetRegionFacts(owner=account, region=region), RegionFacts)

    async def join_token(
        self, account: str, minion_id: str, region: str, ttl_s: int
    ) -> JoinTokenIssued:
        cmd = IssueDeviceJoinToken(account=account, minion_id=minion_id, region=region, ttl_s=ttl_s)
        return await ask(self.broker, cmd, JoinTokenIssued)
