"""Where the CLI finds the bus and who it is on it.

The identity is a NATS credentials file (`.creds`), like `nats context` or a kubeconfig:
`gpufleet login --creds FILE` keeps a copy (0600) under a named context in the config
directory and makes it current; GPUFLEET_NATS_CREDS / GPUFLEET_NATS_URL override the current
context for one shell. The acting account is the credential's own (its JWT says so and the
server lets it publish only that account's subjects); GPUFLEET_ACCOUNT is read only for an
operator's credential, which may act for any account.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpufleet_auth import Creds, write_secret
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_URL = "nats://127.0.0.1:4333"


class CliSettings(BaseSettings):
    """`GPUFLEET_NATS_URL`, `GPUFLEET_NATS_CREDS`, `GPUFLEET_NATS_CA`, `GPUFLEET_ACCOUNT`,
    `GPUFLEET_REQUEST_TIMEOUT_S`, `GPUFLEET_CONFIG_DIR`, `GPUFLEET_CONTEXT`."""

    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    nats_url: str | None = None
    nats_creds: Path | None = None
    nats_ca: Path | None = None
    account: str | None = None  # an operator acting for an account
    request_timeout_s: float = 10.0
    config_dir: Path = Path("~/.config/gpufleet")
    context: str | None = None

    @property
    def url(self) -> str:
        ctx = current_context(self)
        return self.nats_url or (ctx.url if ctx else None) or DEFAULT_URL

    @property
    def servers(self) -> list[str]:
        """The URL split on commas (a cluster may be listed)."""
        return [s.strip() for s in self.url.split(",") if s.strip()]

    @property
    def creds(self) -> Path | None:
        if self.nats_creds is not None:
            return self.nats_creds.expanduser()
        ctx = current_context(self)
        return ctx.creds if ctx else None

    def acting_account(self) -> str | None:
        """The account requests are made for: the credential's, or (operators) GPUFLEET_ACCOUNT."""
        path = self.creds
        if path is None or not path.exists():
            return self.account
        creds = Creds.read(path)
        return creds.tag("account") or self.account


@dataclass(frozen=True)
class Context:
    name: str
    url: str
    creds: Path


def _dir(cfg: CliSettings) -> Path:
    return cfg.config_dir.expanduser() / "contexts"


def current_name(cfg: CliSettings) -> str | None:
    if cfg.context:
        return cfg.context
    marker = _dir(cfg) / "current"
    return marker.read_text().strip() if marker.exists() else None


def read_context(cfg: CliSettings, name: str) -> Context | None:
    path = _dir(cfg) / f"{name}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return Context(name=name, url=str(data["url"]), creds=_dir(cfg) / f"{name}.creds")


def current_context(cfg: CliSettings) -> Context | None:
    name = current_name(cfg)
    return read_context(cfg, name) if name else None


def save_context(cfg: CliSettings, name: str, url: str, creds: Creds) -> Context:
    d = _dir(cfg)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    creds.write(d / f"{name}.creds")
    write_secret(d / f"{name}.json", json.dumps({"url": url}) + "\n")
    use_context(cfg, name)
    ctx = read_context(cfg, name)
    assert ctx is not None
    return ctx


def use_context(cfg: CliSettings, name: str) -> None:
    (_dir(cfg) / "current").write_text(name + "\n")


def list_contexts(cfg: CliSettings) -> list[Context]:
    d = _dir(cfg)
    names = sorted(p.stem for p in d.glob("*.json")) if d.exists() else []
    return [c for n in names if (c := read_context(cfg, n)) is not None]


def load() -> CliSettings:
    """Read the settings now (not cached: tests and scripts may change the environment)."""
    return CliSettings()
