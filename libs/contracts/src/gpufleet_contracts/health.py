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
    REPLY = Health
    READ = True


class NodeHealth(Health):
    """A node agent's health (`gpufleet.v1.node.<minion_id>.health`)."""

    minion_id: str
    simulated: bool | None  # None while the inventory is not read yet
    gpus: int
    running: list[str]  # `<job_id>/<worker>` of the workers running
    started_at: str  # when the agent started, ISO date-time
