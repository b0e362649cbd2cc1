"""Billing events (PRODUCT.md section 8)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from . import subjects
from .base import Event


class UsageCharged(Event):
    """Usage of one worker's run charged to `account` at the locked rate."""

    TYPE = "gpufleet.billing.usage_charged.v1"
    SUBJECT = subjects.event("billing", "usage_charged")
    entry_key: str
    account: str
    job_id: str
    worker: int
    gpu_count: int
    rate: Decimal
    seconds: int
    amount_micro: int  # micro-credits, exact
    at: datetime
