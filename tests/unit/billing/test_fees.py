"""Exact fee arithmetic (R-BILL-1, R-BILL-4, R-BILL-5)."""

from decimal import Decimal

import pytest
from gpufleet_billing.fees import (
    PLATFORM,
    federated_postings,
    from_micro,
    is_federated,
    usage_micro,
    usage_postings,
)


def test_one_rtx_3090_for_an_hour_costs_the_development_fee() -> None:
    assert usage_micro(Decimal("0.05"), 1, 3_600_000) == 50_000


def test_rounding_is_half_even_to_the_micro_credit() -> None:
    # 0.05 credits/h for 1 ms = 0.0138888... micro-credits -> 0
    assert usage_micro(Decimal("0.05"), 1, 1) == 0
    # 0.25 x 1 GPU for 18 ms = 1.25 micro -> 1 (half-even); 54 ms = 3.75 -> 4
    assert usage_micro(Decimal("0.25"), 1, 18) == 1
    assert usage_micro(Decimal("0.25"), 1, 54) == 4
    # 0.18 x 1 GPU for 50 ms = 2.5 micro -> 2 (half to even)
    assert usage_micro(Decimal("0.18"), 1, 50) == 2


def test_usage_postings_sum_to_zero() -> None:
    ps = usage_postings(
        charge="usage",
        payer="acme",
        node_owner="acme",
        gpu_model="RTX 3090",
        rate=Decimal("0.05"),
        gpu_count=2,
        duration_ms=72_000,
    )
    assert [(p.account, p.amount_micro) for p in ps] == [("acme", -2000), (PLATFORM, 2000)]


def test_market_run_a100_example_of_r_bill_4() -> None:
    # A100 at 2.78 per GPU-hour for one hour: the owner earns (2.78 - 0.25) / 2 = 1.265
    ps = usage_postings(
        charge="market",
        payer="buyer",
        node_owner="seller",
        gpu_model="A100 80GB",
        rate=Decimal("2.78"),
        gpu_count=1,
        duration_ms=3_600_000,
    )
    by = {p.account: p.amount_micro for p in ps}
    assert by == {"buyer": -2_780_000, "earnings:seller": 1_265_000, PLATFORM: 1_515_000}
    assert sum(by.values()) == 0


def test_a_run_too_short_to_cost_anything_still_posts_zero_entries() -> None:
    ps = usage_postings(
        charge="usage",
        payer="a",
        node_owner="a",
        gpu_model="T4",
        rate=Decimal("0.25"),
        gpu_count=1,
        duration_ms=3,
    )
    assert [(p.account, p.amount_micro) for p in ps] == [("a", 0), (PLATFORM, 0)]


@pytest.mark.parametrize("micro,text", [(-1000, "-0.001000"), (1, "0.000001"), (0, "0.000000")])
def test_from_micro(micro: int, text: str) -> None:
    assert str(from_micro(micro)) == text


def test_market_split_gives_the_odd_micro_credit_to_the_platform() -> None:
    # 0.35 - 0.25 = 0.10 per GPU-hour to split; over 36 ms: total 3.5 -> 4, fee 2.5 -> 2 micro
    ps = usage_postings(
        charge="market",
        payer="b",
        node_owner="s",
        gpu_model="T4",
        rate=Decimal("0.35"),
        gpu_count=1,
        duration_ms=36,
    )
    by = {p.account: p.amount_micro for p in ps}
    assert by == {"b": -4, "earnings:s": 1, PLATFORM: 3}


def test_market_price_below_the_usage_fee_earns_nothing() -> None:
    ps = usage_postings(
        charge="market",
        payer="b",
        node_owner="s",
        gpu_model="A100 80GB",
        rate=Decimal("0.10"),
        gpu_count=2,
        duration_ms=3_600_000,
    )
    by = {p.account: p.amount_micro for p in ps}
    assert by == {"b": -200_000, "earnings:s": 0, PLATFORM: 200_000}


@pytest.mark.parametrize(
    "job_type,hour_micro",
    [("training", 2_650_000), ("inference", 1_850_000), ("endpoint", 1_850_000)],
)
def test_federated_fee_per_hour_of_r_bill_2(job_type: str, hour_micro: int) -> None:
    assert is_federated("creator", "owner", job_type)
    ps = federated_postings(creator="creator", job_type=job_type, duration_ms=3_600_000)
    assert [(p.account, p.amount_micro) for p in ps] == [
        ("creator", -hour_micro),
        (PLATFORM, hour_micro),
    ]
    # pro rata: 90 minutes of training = 3.975
    half = federated_postings(creator="c", job_type="training", duration_ms=5_400_000)
    assert half[0].amount_micro == -3_975_000


def test_no_federated_fee_for_own_jobs_or_notebooks() -> None:
    assert not is_federated("owner", "owner", "training")
    assert not is_federated("", "owner", "training")
    assert not is_federated("creator", "owner", "notebook")


def test_a_cpu_only_run_on_your_own_node_pays_the_cpu_usage_fee() -> None:
    """R-JOB-2 / R-BILL-1: 8 CPUs for 90 minutes at 0.0125 per CPU-hour = 0.15 credits."""
    p = usage_postings(
        charge="usage",
        payer="acme",
        node_owner="acme",
        gpu_model="",
        rate=Decimal("0.0125"),
        gpu_count=0,
        cpu_count=8,
        duration_ms=5_400_000,
    )
    assert [(x.account, x.amount_micro) for x in p] == [("acme", -150_000), (PLATFORM, 150_000)]


def test_a_cpu_only_run_on_another_accounts_node_splits_like_a_gpu_run() -> None:
    """R-BILL-4 per CPU-hour: 4 CPUs at 0.02 for an hour = 80,000 micro-credits; the platform
    keeps the CPU usage fee (4 x 0.0125 = 50,000) and half the rest; the owner earns 15,000."""
    p = usage_postings(
        charge="market",
        payer="buyer",
        node_owner="seller",
        gpu_model="",
        rate=Decimal("0.02"),
        gpu_count=0,
        cpu_count=4,
        duration_ms=3_600_000,
    )
    assert [(x.account, x.amount_micro, x.kind) for x in p] == [
        ("buyer", -80_000, "market_price"),
        ("earnings:seller", 15_000, "earning"),
        (PLATFORM, 65_000, "platform_share"),
    ]
    assert sum(x.amount_micro for x in p) == 0
    # one third of an hour of 12 CPUs at 0.0125: 0.05 exactly, rounded once
    assert usage_micro(Decimal("0.0125"), 12, 1_200_000) == 50_000
