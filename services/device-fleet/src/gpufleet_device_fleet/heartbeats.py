"""The devices' heartbeats (core NATS, each on its device's own subject): the newest heard of
each device kept in memory and stored once per round (last seen, its period, its telemetry),
so a heartbeat never waits for the database. Touches the database."""

from __future__ import annotations

from datetime import datetime

from gpufleet_bus import Delivery, on_its_own_subject
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.devices import DeviceHeartbeat, DeviceState
from gpufleet_store import Store, now_ms
from pymongo import UpdateOne


class Heartbeats:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.db = store.db
        self.clock = clock
        self._fresh: dict[str, tuple[DeviceHeartbeat, datetime]] = {}  # not stored yet

    async def heard(self, body: DeviceHeartbeat, delivery: Delivery) -> None:
        """A heartbeat counts for the device whose subject it came on (only its credential
        may publish there); a body naming another device refreshes nothing. Memory only."""
        if not on_its_own_subject(delivery.subject, body.minion_id):
            return
        before = self._fresh.get(body.minion_id)
        if before is None or before[0].at <= body.at:
            self._fresh[body.minion_id] = (body, self.clock())

    async def flush(self) -> None:
        """Store what was heard since the last round: one bulk write. `last_seen` only moves
        forwards (a status report sets it too); a removed device is not touched."""
        fresh, self._fresh = self._fresh, {}
        if not fresh:
            return
        writes = [
            UpdateOne(
                {"minion_key": minion, "state": {"$ne": DeviceState.removed.value}},
                {
                    "$max": {"last_seen_ms": now_ms(heard_at)},
                    "$set": {
                        "heartbeat_s": hb.period_s,
                        "telemetry": hb.telemetry.model_dump(mode="json"),
                    },
                },
            )
            for minion, (hb, heard_at) in fresh.items()
        ]
        await self.db.devices.bulk_write(writes, ordered=False)
