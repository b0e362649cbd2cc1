"""A service that starts while JetStream is not ready yet (a cluster electing its meta
leader) asks again instead of exiting (streams.ensure_streams_when_ready), for a while."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_bus import streams
from nats import errors as nats_errors
from nats.js.errors import NotFoundError

pytestmark = pytest.mark.unit


class NotReadyYet:
    """JetStream's stream API as a just-started cluster answers it: `failures` errors first
    (timeouts, no responders), then "no such stream", and the stream is made."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.added: list[str] = []

    async def stream_info(self, name: str) -> Any:
        if self.failures:
            raise self.failures.pop(0)
        raise NotFoundError

    async def add_stream(self, config: Any) -> None:
        self.added.append(config.name)


async def test_it_asks_again_while_jetstream_is_not_ready() -> None:
    js = NotReadyYet([nats_errors.TimeoutError(), nats_errors.NoRespondersError()])
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    await streams.ensure_streams_when_ready(js, sleep=sleep)  # type: ignore[arg-type]
    assert js.added == [s.name for s in streams.STREAMS]
    assert slept == [0.5, 1.0]  # growing pauses


async def test_it_gives_up_with_the_last_error_after_its_time() -> None:
    js = NotReadyYet([nats_errors.TimeoutError() for _ in range(100)])
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    with pytest.raises(nats_errors.TimeoutError):
        await streams.ensure_streams_when_ready(js, wait_s=0.1, sleep=sleep)  # type: ignore[arg-type]
    assert slept == []  # no time for a pause: the error at once
    assert js.added == []


async def test_other_errors_are_not_waited_out() -> None:
    js = NotReadyYet([PermissionError("no STREAM.CREATE")])
    with pytest.raises(PermissionError):
        await streams.ensure_streams_when_ready(js)  # type: ignore[arg-type]
