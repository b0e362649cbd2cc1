"""Device fees (R-BILL-3): each account's devices, charged per finished UTC day by the clock;
a device event for a day already charged corrects that day and the ones after it."""

from __future__ import annotations

from datetime import date

from gpufleet_contracts.devices import DeviceAdded, DeviceRemoved
from gpufleet_store import Transaction

from . import ledger
from .device_fees import DeviceSpan, device_fee_postings, devices_charged
from .keeper import Keeper
from .periods import day_bounds_ms, day_of, days, from_ms, to_ms
from .settle import delta, next_revision


class Devices(Keeper):
    async def device_added(self, evt: DeviceAdded) -> int:
        async with self.lock:
            doc = await self.db.devices.find_one({"_id": evt.device_id}) or {}
            added = to_ms(evt.at)
            if "added_ms" in doc and int(doc["added_ms"]) <= added:
                return 0  # a replay (or a later re-add of the same id: the first span stands)
            doc.update({"_id": evt.device_id, "account": evt.account, "added_ms": added})
            await self.db.devices.replace_one({"_id": evt.device_id}, doc, upsert=True)
            return await self._resettle_device_days(evt.account, day_of(added))

    async def device_removed(self, evt: DeviceRemoved) -> int:
        async with self.lock:
            doc = await self.db.devices.find_one({"_id": evt.device_id}) or {}
            removed = to_ms(evt.at)
            if "removed_ms" in doc and int(doc["removed_ms"]) <= removed:
                return 0
            doc.update({"_id": evt.device_id, "account": evt.account, "removed_ms": removed})
            await self.db.devices.replace_one({"_id": evt.device_id}, doc, upsert=True)
            return await self._resettle_device_days(evt.account, day_of(removed))

    async def _resettle_device_days(self, account: str, first: date) -> int:
        """A device event for a day already charged corrects that day and the ones after it.
        The caller holds the lock, so the cursor cannot move meanwhile."""
        cursor = await self._cursor(f"devicefee:{account}")
        if cursor is None or first >= cursor:
            return 0
        return sum([await self._settle_device_day(account, d) for d in days(first, cursor)])

    async def _spans(self, account: str, tx: Transaction | None = None) -> list[DeviceSpan]:
        docs = self.db.devices.find({"account": account}, session=tx.session if tx else None)
        return [
            DeviceSpan(d["_id"], int(d["added_ms"]), d.get("removed_ms"))
            for d in await docs.to_list(None)
            if "added_ms" in d
        ]

    async def _settle_device_day(self, account: str, day: date) -> int:
        group = f"devicefee:{account}:{day.isoformat()}"

        async def body(tx: Transaction) -> int:
            count = devices_charged(await self._spans(account, tx), day)
            target = device_fee_postings(account, count, day) if count else []
            have = await ledger.posted(self.db, group, tx)
            entries = ledger.stage_entries(
                group=group,
                stage=next_revision(have),
                postings=delta(target, have),
                at=from_ms(day_bounds_ms(day)[0]),
                recorded_at=self.clock(),
                meta={
                    "day": day.isoformat(),
                    "devices": count,
                    "memo": f"{count} device(s) on {day.isoformat()}",
                },
            )
            await ledger.insert(self.db, tx, entries)
            return len(entries)

        return await self._write(body)

    async def charge_device_days(self, today: date) -> int:
        """Charge every finished day not charged yet, for every account with devices."""
        written = 0
        for account in sorted(set(await self.db.devices.distinct("account"))):
            if self.stopping:
                break
            async with self.lock:  # the days and the cursor move together
                spans = await self._spans(account)
                if not spans:
                    continue
                key = f"devicefee:{account}"
                first = await self._cursor(key) or min(day_of(s.added_ms) for s in spans)
                for d in days(first, today):
                    written += await self._settle_device_day(account, d)
                if first < today:
                    await self._set_cursor(key, today)
        return written
