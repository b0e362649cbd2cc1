"""Fee arithmetic, pure and exact (PRODUCT.md section 8).

Amounts are integer micro-credits (1 credit = 1,000,000). An amount is computed in Decimal from
the locked rate and an exact time in milliseconds and rounded once, half to even, to the
micro-credit. The postings of one charge always sum to zero (double entry): where a split
cannot be even, the platform account takes the odd micro-credit.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from gpufleet_contracts.catalog import catalog
from gpufleet_contracts.identity import PLATFORM_ACCOUNT

MICRO = Decimal(1_000_000)
MS_PER_HOUR = 3_600_000
# The platform's own revenue account: a name no tenant account may take (R-TEN-1,
# gpufleet_contracts.identity.RESERVED_ACCOUNTS).
PLATFORM = PLATFORM_ACCOUNT
EARNINGS_PREFIX = "earnings:"

# R-BILL-2: per worker-hour, whatever the GPU type or count. Notebooks are interactive work, not
# "federated training or inference": the rule names no fee for them, so none is charged.
FEDERATED_FEE_PER_HOUR: dict[str, Decimal] = {
    "training": Decimal("2.65"),
    "inference": Decimal("1.85"),
    "endpoint": Decimal("1.85"),
}


def earnings_account(account: str) -> str:
    """The sub-account where `account`'s earnings wait for their payout (R-PROV-1)."""
    return f"{EARNINGS_PREFIX}{account}"


def to_micro(credits: Decimal) -> int:
    return int((credits * MICRO).to_integral_value(rounding=ROUND_HALF_EVEN))


def from_micro(micro: int) -> Decimal:
    return (Decimal(micro) / MICRO).quantize(Decimal("0.000001"))


def usage_micro(rate: Decimal, units: int, duration_ms: int) -> int:
    """`rate` credits per GPU-hour (or CPU-hour), for `units` GPUs (or CPUs), during
    `duration_ms`."""
    return to_micro(rate * units * Decimal(duration_ms) / MS_PER_HOUR)


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
    gpu_fraction: Decimal | None = None,
    cpu_count: int = 0,
) -> list[Posting]:
    """The postings for `duration_ms` of one worker's run.

    `usage` (R-BILL-1): the project owner ran on their own node and pays the usage fee to the
    platform. `market` (R-BILL-4): the buyer pays the full price; the platform keeps the usage
    fee and splits the rest evenly with the node's owner, whose half goes to their earnings
    sub-account. A fractional GPU (R-SCHED-4) arrives with its share's rate already, and
    its usage fee is the same share of the class's fee. A CPU-only worker (`cpu_count`,
    R-JOB-2) is priced per CPU-hour in the same way: `rate` per CPU-hour for its CPUs, and
    the catalogue's CPU usage fee as the platform's fee.
    """
    units = cpu_count or gpu_count
    total = usage_micro(rate, units, duration_ms)
    if charge == "usage":
        return [Posting(payer, -total, "usage_fee"), Posting(PLATFORM, total, "usage_fee")]
    if cpu_count:
        fee_rate = catalog().usage_fee_per_cpu_hour
    else:
        fee_rate = catalog().usage_fee_per_gpu_hour(gpu_model) * (gpu_fraction or 1)
    fee = usage_micro(fee_rate, units, duration_ms)
    fee = min(fee, total)  # a price below the usage fee: the platform takes all of it
    earning = (total - fee) // 2
    return [
        Posting(payer, -total, "market_price"),
        Posting(earnings_account(node_owner), earning, "earning"),
        Posting(PLATFORM, total - earning, "platform_share"),
    ]


def federated_rate(job_type: str) -> Decimal | None:
    return FEDERATED_FEE_PER_HOUR.get(job_type)


def is_federated(creator: str, payer: str, job_type: str) -> bool:
    """R-BILL-2 applies when someone other than the project owner created the job."""
    return bool(creator) and creator != payer and federated_rate(job_type) is not None


def federated_postings(*, creator: str, job_type: str, duration_ms: int) -> list[Posting]:
    rate = federated_rate(job_type) or Decimal(0)
    amount = to_micro(rate * Decimal(duration_ms) / MS_PER_HOUR)
    return [Posting(creator, -amount, "federated_fee"), Posting(PLATFORM, amount, "federated_fee")]
