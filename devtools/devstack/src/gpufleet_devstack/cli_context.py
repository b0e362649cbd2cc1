"""The CLI context `just up` leaves for its user: `local`, the stack's URL and the credential
of user `dev` of account `local`, so that `gpufleet ...` in a new terminal talks to this
stack with no flags, as kind and minikube leave a kubectl context."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet_auth import Creds
from gpufleet_cli import settings as cli_settings

CONTEXT = "local"


@dataclass(frozen=True)
class Saved:
    name: str
    current: bool  # made current; False: the developer's own current context was kept
    other: str | None  # that context


def save_local_context(url: str, creds: Path) -> Saved:
    """Write context `local` (refreshed at every `just up`: the URL may have changed) and
    make it current, unless the developer has made another context current."""
    cfg = cli_settings.load()
    current = cli_settings.current_name(cfg)
    keep = current is not None and current != CONTEXT and cli_settings.read_context(cfg, current)
    cli_settings.save_context(cfg, CONTEXT, url, Creds.read(creds))
    if keep:
        assert current is not None
        cli_settings.use_context(cfg, current)
        return Saved(CONTEXT, current=False, other=current)
    return Saved(CONTEXT, current=True, other=None)
