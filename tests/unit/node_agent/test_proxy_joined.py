"""A caller's connection through the proxy (proxy/joined.py): the writes of one turn of the
event loop go out in one call, a lone write by the next turn, and closing, aborting and the
buffer's size see what is held. The proxy's own tests run every answer through it."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet_node_agent.proxy.joined import JoinedWrites


class Recorded(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5)}.get(name, default)


async def turn() -> None:
    await asyncio.sleep(0)


async def test_a_head_and_its_body_written_in_one_turn_go_in_one_call() -> None:
    inner = Recorded()
    joined = JoinedWrites(inner, asyncio.get_running_loop())
    joined.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert inner.writes == []
    assert joined.get_write_buffer_size() == 7 + 38
    joined.write(b"ok")
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    await turn()
    assert len(inner.writes) == 1  # nothing is sent twice


async def test_a_lone_write_goes_by_the_next_turn_and_a_third_is_held_again() -> None:
    inner = Recorded()
    joined = JoinedWrites(inner, asyncio.get_running_loop())
    joined.write(b"head")
    await turn()
    assert inner.writes == [b"head"]
    joined.write(b"a")
    joined.write(b"b")
    joined.write(b"c")
    joined.write(b"")  # nothing to write: not a write
    assert inner.writes == [b"head", b"ab"]
    await turn()
    assert inner.writes == [b"head", b"ab", b"c"]


async def test_closing_sends_what_is_held_first_and_aborting_drops_it() -> None:
    inner = Recorded()
    joined = JoinedWrites(inner, asyncio.get_running_loop())
    joined.write(b"last")
    joined.close()
    assert (inner.writes, inner.closed) == ([b"last"], True)
    await turn()
    assert inner.writes == [b"last"]

    inner = Recorded()
    joined = JoinedWrites(inner, asyncio.get_running_loop())
    joined.write(b"never")
    joined.abort()
    await turn()
    assert (inner.writes, inner.aborted) == ([], True)
    assert joined.get_extra_info("peername") == ("127.0.0.1", 5)
