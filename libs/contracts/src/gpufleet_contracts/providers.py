"""Provider events (PRODUCT.md section 2)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import limits, subjects
from .base import Command, Event, Message
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


# --- an account's requests about its providers and regions (the provisioner's) --------------


def _none(value: Any) -> bool:
    """A reply leaves out a key it has no value for (the CLI shows every key it gets)."""
    return value is None


class LifecycleSink(BaseModel):
    """Where a GCP project's instance lifecycle reaches gpufleet: its Logging sink, the
    Pub/Sub topic it writes to and the subscription the provisioner reads."""

    topic: str
    subscription: str
    sink: str
    sink_filter: str
    writer_identity: str  # to be granted roles/pubsub.publisher on the topic


class ProviderView(BaseModel):
    """A provider as enabled (EnableProvider's reply, ListProviders' items): never its key."""

    account: str
    provider: ProviderKind
    payment_mode: PaymentMode
    enabled_at: str | None  # ISO 8601
    gcp_project_id: str | None = Field(default=None, exclude_if=_none)
    client_email: str | None = Field(default=None, exclude_if=_none)
    lifecycle: LifecycleSink | None = Field(default=None, exclude_if=_none)
    # the burst policy's fields set by SetBurstPolicy (the rest are the defaults)
    policy: dict[str, int | float] | None = Field(default=None, exclude_if=_none)


class EnableProvider(Command):
    """Enable `physical` or `gcp` (with a service-account key) once (R-PROV-1/2). The
    provider and the payment mode are the rules' to check (their refusals name R-PROV-1)."""

    TYPE = "gpufleet.provider.enable.v1"
    SUBJECT = subjects.rpc("provisioner", "enable_provider")
    REPLY = ProviderView
    provider: str = Field(min_length=1)  # physical | gcp
    payment_mode: str = Field(default="credits", min_length=1)
    key_json: str | None = Field(default=None, repr=False)  # gcp: the service-account key


class Providers(Message):
    """The reply to ListProviders."""

    providers: list[ProviderView]


class ListProviders(Command):
    """An account's request: its providers (never their keys)."""

    TYPE = "gpufleet.provider.list.v1"
    SUBJECT = subjects.rpc("provisioner", "list_providers")
    REPLY = Providers
    READ = True


class BurstPolicy(Message):
    """The reply to SetBurstPolicy: the policy now in force."""

    max_nodes: int
    max_nodes_per_region: int
    max_new_per_pass: int
    idle_s: float
    min_age_s: float
    boot_timeout_s: float


class SetBurstPolicy(Command):
    """The account's gcp burst policy (R-SCHED-3); a field left out keeps its value."""

    TYPE = "gpufleet.provider.set_burst_policy.v1"
    SUBJECT = subjects.rpc("provisioner", "set_burst_policy")
    REPLY = BurstPolicy
    max_nodes: Int | None = Field(default=None, ge=0)  # cloud nodes alive at once
    max_nodes_per_region: Int | None = Field(default=None, ge=0)
    max_new_per_pass: Int | None = Field(default=None, ge=1)  # instances asked for at once
    idle_s: float | None = Field(default=None, ge=0)  # deleted after idle this long
    min_age_s: float | None = Field(default=None, ge=0)
    boot_timeout_s: float | None = Field(default=None, ge=0)


class QuotaUse(BaseModel):
    model_config = ConfigDict(frozen=True)

    limit: int | float
    usage: int | float


class RegionView(BaseModel):
    """A region as created (CreateRegion's reply, ListRegions' items); a GCP region also
    with its zones, quotas, runnable jobs per GPU type (R-REG-3) and storage."""

    name: str
    owner: str
    provider: ProviderKind
    storage_mode: str | None  # local | central
    allow_public_jobs: bool
    created_at: str | None  # ISO 8601
    quotas: dict[str, QuotaUse] | None = Field(default=None, exclude_if=_none)
    runnable_jobs: dict[str, int] | None = Field(default=None, exclude_if=_none)
    zones: list[str] | None = Field(default=None, exclude_if=_none)
    storage_class: str | None = Field(default=None, exclude_if=_none)
    storage_size_gb: int | None = Field(default=None, exclude_if=_none)


class CreateRegion(Command):
    """A physical (R-REG-1) or GCP (R-REG-2) region. Physical: `storage_mode` and
    `allow_public_jobs`; gcp: `storage_class`. The name's form is the rules' to check."""

    TYPE = "gpufleet.provider.create_region.v1"
    SUBJECT = subjects.rpc("provisioner", "create_region")
    REPLY = RegionView
    provider: str = Field(default="physical", min_length=1)  # physical | gcp
    name: str = Field(min_length=1, max_length=limits.NAME_CHARS)
    storage_mode: str = "local"  # physical: local | central
    allow_public_jobs: bool = False  # physical: sell spare capacity
    storage_class: str = "standard"  # gcp: standard | large


class Regions(Message):
    """The reply to ListRegions."""

    regions: list[RegionView]


class ListRegions(Command):
    """An account's request: its regions."""

    TYPE = "gpufleet.provider.list_regions.v1"
    SUBJECT = subjects.rpc("provisioner", "list_regions")
    REPLY = Regions
    READ = True


class RegionQuotas(Message):
    """The reply to ShowRegionQuotas."""

    region: str
    quotas: dict[str, QuotaUse]  # metric -> limit and usage
    runnable_jobs: dict[str, int]  # GPU type -> jobs (R-REG-3)


class ShowRegionQuotas(Command):
    """A supported GCP region's quotas and runnable jobs per GPU type (R-REG-3)."""

    TYPE = "gpufleet.provider.region_quotas.v1"
    SUBJECT = subjects.rpc("provisioner", "region_quotas")
    REPLY = RegionQuotas
    READ = True
    name: str = Field(min_length=1, max_length=limits.NAME_CHARS)
