from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .base import Command


class Health(BaseModel):
    model_config = ConfigDict(extra="allow")
    service: str
    status: str
    version: str
    collections: list[str]


class HealthCheck(Command):
    """Ask a service (or a node agent) whether it is up: it answers Health."""

    TYPE = "gpufleet.health.check.v1"
