"""An account's removal (the provisioner's `AccountRemoved`): each of its devices removed as
`remove_device` removes one (its `DeviceRemoved`: billing's daily fee stops after that day,
R-BILL-3; the provisioner revokes its enrolment) and its open rollouts cancelled, in one
transaction. A redelivery finds nothing live and changes nothing. Touches the database and
the outbox."""

from __future__ import annotations

import logging

from gpufleet_contracts.identity import AccountRemoved
from gpufleet_store import Store, Transaction

from .deployments import Deployments
from .devices import Devices

log = logging.getLogger("gpufleet.device_fleet.accounts")
REASON = "account removed"


class AccountRemoval:
    def __init__(self, store: Store, devices: Devices, deployments: Deployments) -> None:
        self.store = store
        self.devices = devices
        self.deployments = deployments

    async def removed(self, evt: AccountRemoved) -> None:
        """The account's devices removed at its removal's time, then its open rollouts
        cancelled (a removed device is sent no revert)."""

        async def tx_body(tx: Transaction) -> tuple[int, int]:
            devices = await self.devices.remove_all(tx, evt.account, evt.at)
            rollouts = await self.deployments.cancel_all(tx, evt.account, evt.at, REASON)
            return devices, rollouts

        devices, rollouts = await self.store.transaction(tx_body)
        if devices or rollouts:
            log.warning(
                "account %s removed: %d device(s) removed, %d rollout(s) cancelled",
                evt.account,
                devices,
                rollouts,
            )
