"""Where the CLI finds the bus and who it acts as (environment, prefix GPUFLEET_)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class CliSettings(BaseSettings):
    """`GPUFLEET_NATS_URL`, `GPUFLEET_ACCOUNT`, `GPUFLEET_REQUEST_TIMEOUT_S`."""

    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4333"
    account: str = "local"
    request_timeout_s: float = 10.0

    @property
    def servers(self) -> list[str]:
        """`nats_url` split on commas (a cluster may be listed)."""
        return [s.strip() for s in self.nats_url.split(",") if s.strip()]


def load() -> CliSettings:
    """Read the settings now (not cached: tests and scripts may change the environment)."""
    return CliSettings()
