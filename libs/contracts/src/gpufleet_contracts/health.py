from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Health(BaseModel):
    model_config = ConfigDict(extra="allow")
    service: str
    status: str
    version: str
    collections: list[str]
