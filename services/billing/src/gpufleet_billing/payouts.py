"""Payouts (R-PROV-1): a `credits` provider's earnings moved into its billing account for
every finished UTC day, by the clock."""

from __future__ import annotations

import logging
from datetime import date, timedelta

from gpufleet_contracts.providers import PaymentMode, ProviderEnabled
from gpufleet_store import Transaction

from . import ledger
from .fees import Posting, earnings_account
from .keeper import Keeper
from .periods import day_bounds_ms, day_of, days, from_ms, to_ms
from .settle import next_revision

log = logging.getLogger("gpufleet.billing")


class Payouts(Keeper):
    async def provider_enabled(self, evt: ProviderEnabled) -> None:
        if evt.payment_mode != PaymentMode.credits:
            log.info("%s pays by %s: no payouts", evt.account, evt.payment_mode)
            return
        since = to_ms(evt.at)
        async with self.lock:
            doc = await self.db.payout_accounts.find_one({"_id": evt.account})
            if doc is None or int(doc["since_ms"]) > since:
                await self.db.payout_accounts.replace_one(
                    {"_id": evt.account}, {"_id": evt.account, "since_ms": since}, upsert=True
                )

    async def make_payouts(self, today: date) -> int:
        """Pay each `credits` account its earnings up to the end of every finished day.

        The latest finished day is settled again on every tick, so an earning learned late is
        paid within one tick rather than a day later.
        """
        written = 0
        yesterday = today - timedelta(days=1)
        for acc in await self.db.payout_accounts.find({}).to_list(None):
            if self.stopping:
                break
            account, key = acc["_id"], f"payout:{acc['_id']}"
            since = day_of(int(acc["since_ms"]))
            async with self.lock:
                first = max(since, min(await self._cursor(key) or since, yesterday))
                for d in days(first, today):
                    written += await self._settle_payout(account, d)
                if first < today:
                    await self._set_cursor(key, today)
        return written

    async def _settle_payout(self, account: str, day: date) -> int:
        group = f"payout:{account}:{day.isoformat()}"
        sub = earnings_account(account)
        end_ms = day_bounds_ms(day)[1]

        async def body(tx: Transaction) -> int:
            earned = paid = 0
            async for e in self.db.ledger.find({"account": sub}, session=tx.session):
                if e["kind"] == "payout":
                    paid -= int(e["amount_micro"])
                elif int(e["at_ms"]) < end_ms:
                    earned += int(e["amount_micro"])
            amount = earned - paid
            if amount == 0:
                return 0
            have = await ledger.posted(self.db, group, tx)
            entries = ledger.stage_entries(
                group=group,
                stage=next_revision(have),
                postings=[Posting(sub, -amount, "payout"), Posting(account, amount, "payout")],
                at=from_ms(end_ms),
                recorded_at=self.clock(),
                meta={
                    "day": day.isoformat(),
                    "owner": account,
                    "memo": f"earnings up to the end of {day.isoformat()}",
                },
            )
            await ledger.insert(self.db, tx, entries)
            return len(entries)

        return await self._write(body)
