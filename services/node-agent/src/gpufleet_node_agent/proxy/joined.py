"""A caller's connection whose writes within one turn of the event loop go out together.

uvicorn writes an answer's head as soon as the app starts it and its body when the app
sends it: two system calls, two TCP segments and two wake-ups of the caller for every
buffered answer (forward.answer). JoinedWrites holds a write that finds nothing held until
the next write, which then goes with it in one call, or until the loop's next turn, when
it goes alone: a head and its body leave together, and a write never waits longer than the
rest of the turn it was made in. Closing, half-closing and the buffer's size see the held
bytes."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class JoinedWrites(asyncio.Transport):
    """Wraps the caller's transport for the protocol; everything but writing passes through."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held is None:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        self._transport.write(held + data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)  # a websocket's upgrade hands the connection on

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class JoinedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through JoinedWrites (uvicorn.Config's `http`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        super().connection_made(JoinedWrites(transport, asyncio.get_running_loop()))
