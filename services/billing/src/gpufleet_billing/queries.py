"""The read side: balances, entries, job costs and earnings of one account (R-TEN-2: only its
own). Sums are computed here from the entries themselves, so a balance is always their sum."""

from __future__ import annotations

from datetime import datetime

from gpufleet_contracts.billing import (
    Balance,
    Earnings,
    Entry,
    JobCost,
    KindCost,
    LedgerSeries,
    NodeEarnings,
    Period,
    RegionEarnings,
    SeriesPoint,
)
from gpufleet_store import Doc
from pymongo.asynchronous.database import AsyncDatabase

from .fees import earnings_account, from_micro
from .periods import to_ms
from .series import Movement, summed


def parse_time(value: str | None) -> int | None:
    """An ISO date or date-time (naive = UTC) as epoch ms; None stays None."""
    if not value:
        return None
    return to_ms(datetime.fromisoformat(value))


def _range(from_ms: int | None, to_ms_: int | None) -> Doc:
    cond: Doc = {}
    if from_ms is not None:
        cond["$gte"] = from_ms
    if to_ms_ is not None:
        cond["$lt"] = to_ms_
    return {"at_ms": cond} if cond else {}


def money(micro: int) -> str:
    return str(from_micro(micro))


class Queries:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.db = db

    async def _sum(self, account: str) -> tuple[int, int]:
        total = count = 0
        async for e in self.db.ledger.find({"account": account}, {"amount_micro": 1}):
            total += int(e["amount_micro"])
            count += 1
        return total, count

    async def balance(self, account: str) -> Balance:
        total, count = await self._sum(account)
        unpaid, _ = await self._sum(earnings_account(account))
        return Balance(
            account=account,
            balance=money(total),
            balance_micro=total,
            entries=count,
            earnings_unpaid=money(unpaid),
            earnings_unpaid_micro=unpaid,
        )

    async def entries(
        self, account: str, limit: int, from_ms: int | None = None, to_ms_: int | None = None
    ) -> list[Entry]:
        query = {"account": {"$in": [account, earnings_account(account)]}}
        docs = self.db.ledger.find({**query, **_range(from_ms, to_ms_)})
        return [entry(e) for e in await docs.sort("at_ms", -1).to_list(limit)]

    async def job_cost(self, job_id: str, account: str) -> JobCost:
        docs = await self.db.ledger.find({"job_id": job_id, "account": account}).to_list(None)
        by_kind: dict[str, int] = {}
        for e in docs:
            by_kind[e["kind"]] = by_kind.get(e["kind"], 0) - int(e["amount_micro"])
        micro = sum(by_kind.values())
        return JobCost(
            job_id=job_id,
            cost=money(micro),
            cost_micro=micro,
            by_kind={k: KindCost(cost=money(v), cost_micro=v) for k, v in sorted(by_kind.items())},
            entries=[entry(e) for e in sorted(docs, key=lambda e: e["at_ms"])],
        )

    async def earnings(
        self, account: str, from_ms: int | None = None, to_ms_: int | None = None
    ) -> Earnings:
        query = {"account": earnings_account(account), **_range(from_ms, to_ms_)}
        nodes: dict[tuple[str, str], int] = {}
        regions: dict[str, int] = {}
        earned = paid = 0
        async for e in self.db.ledger.find(query):
            amount = int(e["amount_micro"])
            if e["kind"] == "payout":
                paid -= amount
                continue
            earned += amount
            node = (str(e.get("node_id", "")), str(e.get("region", "")))
            nodes[node] = nodes.get(node, 0) + amount
            regions[node[1]] = regions.get(node[1], 0) + amount
        return Earnings(
            account=account,
            earned=money(earned),
            earned_micro=earned,
            paid_out=money(paid),
            paid_out_micro=paid,
            by_node=[
                NodeEarnings(node_id=n, region=r, earned=money(v), earned_micro=v)
                for (n, r), v in sorted(nodes.items())
            ],
            by_region=[
                RegionEarnings(region=r, earned=money(v), earned_micro=v)
                for r, v in sorted(regions.items())
            ],
        )

    async def series(
        self,
        account: str,
        period: Period,
        limit: int,
        from_ms: int | None = None,
        to_ms_: int | None = None,
    ) -> LedgerSeries:
        earnings = earnings_account(account)
        query = {"account": {"$in": [account, earnings]}, **_range(from_ms, to_ms_)}
        fields = {"account": 1, "amount_micro": 1, "at_ms": 1, "kind": 1}
        movements = [
            Movement(
                at_ms=int(e["at_ms"]),
                amount_micro=int(e["amount_micro"]),
                earning=e["account"] == earnings,
                payout=e.get("kind") == "payout",
            )
            async for e in self.db.ledger.find(query, fields)
        ]
        return LedgerSeries(
            account=account,
            period=period,
            points=[
                SeriesPoint(
                    start=p.start,
                    spent=money(p.spent_micro),
                    spent_micro=p.spent_micro,
                    earned=money(p.earned_micro),
                    earned_micro=p.earned_micro,
                )
                for p in summed(movements, period, limit)
            ],
        )


def entry(e: Doc) -> Entry:
    at = e["at"]
    return Entry(
        key=e["key"],
        account=e["account"],
        kind=e["kind"],
        amount=money(int(e["amount_micro"])),
        amount_micro=int(e["amount_micro"]),
        job_id=e.get("job_id"),
        worker=e.get("worker"),
        day=e.get("day"),
        at=at.isoformat() if isinstance(at, datetime) else str(at),
        memo=e.get("memo"),
    )
