"""Fee arithmetic, pure and exact (PRODUCT.md section 8).

Amounts are integer micro-credits (1 credit = 1,000,000). Each entry's amount is computed in
Decimal from the locked rate and the exact run time in milliseconds, and rounded once, half to
even, to the micro-credit. The entries of one charge always sum to zero (double entry): where a
split cannot be even, the platform account takes the odd micro-credit.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from gpufleet_contracts.catalog import catalog

MICRO = Decimal(1_000_000)
MS_PER_HOUR = Decimal(3_600_000)
PLATFORM = "platform"  # the platform's own revenue account


def to_micro(credits: Decimal) -> int:
    return int((credits * MICRO).to_integral_value(rounding=ROUND_HALF_EVEN))


def from_micro(micro: int) -> Decimal:
    return (Decimal(micro) / MICRO).quantize(Decimal("0.000001"))


def usage_micro(rate: Decimal, gpu_count: int, duration_ms: int) -> int:
    """`rate` credits per GPU-hour, for `gpu_count` GPUs, during `duration_ms`."""
    return to_micro(rate * gpu_count * Decimal(duration_ms) / MS_PER_HOUR)


@dataclass(frozen=True)
class Posting:
    account: str
    amount_micro: int  # negative: charged; positive: credited
    kind: str


def usage_postings(
    *,
    charge: str,
    payer: str,
    node_owner: str,
    gpu_model: str,
    rate: Decimal,
    gpu_count: int,
    duration_ms: int,
) -> list[Posting]:
    """The postings for one worker run.

    `usage` (R-BILL-1): the project owner ran on their own node and pays the usage fee to the
    platform. `market` (R-BILL-4): the buyer pays the full price; the platform keeps the usage
    fee and splits the rest evenly with the node's owner.
    """
    total = usage_micro(rate, gpu_count, duration_ms)
    # A run too short to cost a micro-credit still gets its (zero) entries: every run leaves
    # its trace in the ledger.
    if charge == "usage":
        return [Posting(payer, -total, "usage_fee"), Posting(PLATFORM, total, "usage_fee")]
    fee = usage_micro(catalog().usage_fee_per_gpu_hour(gpu_model), gpu_count, duration_ms)
    fee = min(fee, total)  # a price below the usage fee: the platform takes all of it
    earning = (total - fee) // 2
    return [
        Posting(payer, -total, "market_price"),
        Posting(node_owner, earning, "earning"),
        Posting(PLATFORM, total - earning, "platform_share"),
    ]
