"""Provider events (PRODUCT.md section 2)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from . import subjects
from .base import Event
from .fields import Int, Name


class ProviderKind(StrEnum):
    physical = "physical"
    gcp = "gcp"


class PaymentMode(StrEnum):
    credits = "credits"  # earnings paid into the billing account every 24 h (R-PROV-1)
    stripe = "stripe"  # "coming soon": refused when enabling


class ProviderEnabled(Event):
    """An account enabled a provider (at most once each). Never carries a key or secret."""

    TYPE = "gpufleet.provider.enabled.v1"
    SUBJECT = subjects.event("provider", "enabled")
    account: str
    provider: ProviderKind
    payment_mode: PaymentMode
    gcp_project_id: str | None = None
    at: datetime


class RegionCreated(Event):
    """A region was created (R-REG-1 / R-REG-2). GCP regions carry their runnable jobs."""

    TYPE = "gpufleet.provider.region_created.v1"
    SUBJECT = subjects.event("provider", "region_created")
    account: str
    provider: ProviderKind
    name: Name
    storage_mode: str | None = None
    allow_public_jobs: bool = False
    runnable_jobs: dict[str, Int] = Field(default_factory=dict)  # GPU type -> jobs (R-REG-3)
    at: datetime
