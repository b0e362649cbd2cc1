"""The scheduler's settings, from the environment (GPUFLEET_*)."""

from __future__ import annotations

import logging
import socket

from gpufleet_store import SecretBox
from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("gpufleet.scheduler")


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GPUFLEET_", extra="ignore", frozen=True, populate_by_name=True
    )

    # anti-starvation: a worker older than this holds a node (GPUFLEET_STARVE_AFTER_S)
    starve_after_s: float = 300.0
    max_holds: int = 16
    explain_budget: int = 32  # request shapes explained per pass (queue.py)
    # PendingDemandChanged at most this often (demand.py; GPUFLEET_DEMAND_EVERY_S)
    demand_every_s: float = 1.0
    # the leader reads what changed this often (bounds staleness)
    resync_s: float = Field(
        30.0, validation_alias=AliasChoices("GPUFLEET_SCHEDULER_RESYNC_S", "resync_s")
    )
    # the leader writes its memory this often (checkpoint.py)
    checkpoint_s: float = Field(
        60.0, validation_alias=AliasChoices("GPUFLEET_SCHEDULER_CHECKPOINT_S", "checkpoint_s")
    )
    # Fernet key sealing job secrets at rest (GPUFLEET_SECRET_KEY). None: a key made for
    # this process (in-process tests; `python -m gpufleet_scheduler` refuses to run without
    # one unless GPUFLEET_EPHEMERAL_SECRET_KEY=1).
    secret_key: str | None = Field(default=None, repr=False)
    lease_ttl_s: float = 10.0  # the leader's lease (leadership.py)
    # A name stable across restarts (the host's: a container's survives its restarts) lets a
    # restarted leader take its lease back at once (leadership.py).
    instance: str = Field(
        default_factory=socket.gethostname,
        validation_alias=AliasChoices("GPUFLEET_SCHEDULER_INSTANCE", "instance"),
    )

    @field_validator("secret_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("instance", mode="before")
    @classmethod
    def _host_by_default(cls, v: object) -> object:
        return v or socket.gethostname()

    def box(self) -> SecretBox:
        if self.secret_key:
            return SecretBox(self.secret_key)
        log.warning(
            "no GPUFLEET_SECRET_KEY: job secrets are sealed with a key of this process, "
            "which another process or a restart cannot open"
        )
        return SecretBox.for_process()
