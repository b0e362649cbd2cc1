"""Helpers for integration tests: run service apps in-process against the real servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from faststream import FastStream
from gpufleet_bus import BusSettings, make_broker
from gpufleet_store import Store, StoreSettings


def store_for(service: str, mongo_url: str, prefix: str) -> Store:
    return Store.connect(service, StoreSettings(mongo_url=mongo_url, db_prefix=prefix))


def broker_for(service: str, nats_url: str):  # type: ignore[no-untyped-def]
    return make_broker(service, BusSettings(nats_url=nats_url))


@asynccontextmanager
async def running(*apps: FastStream) -> AsyncIterator[None]:
    """Start apps (startup hooks, broker, after-startup hooks) and stop them at the end."""
    started: list[FastStream] = []
    try:
        for app in apps:
            await app.start()
            started.append(app)
        yield
    finally:
        for app in reversed(started):
            await app.stop()
