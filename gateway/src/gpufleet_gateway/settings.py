"""The gateway's settings (environment, `GPUFLEET_` prefix, as the services')."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 8470


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4333"  # comma-separated for a cluster
    nats_creds: Path | None = None  # the gateway's own identity: it may only redeem codes
    nats_ca: Path | None = None
    console_host: str = "127.0.0.1"
    console_port: int = DEFAULT_PORT
    # Behind TLS (a reverse proxy): the session cookie is sent over HTTPS only.
    console_secure_cookie: bool = False
    console_refresh_s: float = 1.0  # how often a live page's data is read again (SSE)
    console_web_dir: Path | None = None  # the static files; default: gateway/web

    @property
    def servers(self) -> list[str]:
        return [s.strip() for s in self.nats_url.split(",") if s.strip()]
