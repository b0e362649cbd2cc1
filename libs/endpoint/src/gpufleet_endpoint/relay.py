"""`python -m gpufleet_endpoint relay --uds SOCK --to HOST:PORT -- COMMAND...`: an endpoint's
own server (R-JOB-6, a manual command on port 80) reached from outside a container that has
no network: each connection to the unix socket `SOCK` is relayed byte for byte to HOST:PORT
inside the container, where COMMAND listens.

COMMAND runs as the relay's child: SIGTERM and SIGINT are passed on to it, and the relay
exits with its exit status (128 + the signal's number if a signal ended it) as soon as it
ends, so a server that daemonises and exits ends the job with its own status and log. A
connection that comes before COMMAND listens is closed at once (the node's proxy then tells
it is not ready yet). Standard library only: it runs in the job's Python, 3.8 on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import Sequence

CHUNK = 65536


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet_endpoint relay",
        description="Run COMMAND and relay a unix socket's connections to where it listens.",
    )
    parser.add_argument("--uds", required=True, help="the unix socket to listen on")
    parser.add_argument("--to", default="127.0.0.1:80", help="HOST:PORT (127.0.0.1:80)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("a COMMAND to run is required (after --)")
    return args


def target(to: str) -> tuple[str, int]:
    host, _, port = to.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until `reader` ends, then half-close `writer` (the other way may go on)."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def _relay(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, host: str, port: int
) -> None:
    try:
        server_r, server_w = await asyncio.open_connection(host, port)
    except OSError:  # not listening (yet): the caller sees the connection closed
        client_w.close()
        return
    try:
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))
    finally:
        server_w.close()
        client_w.close()


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


async def run(uds: str, to: str, command: list[str]) -> int:
    host, port = target(to)
    try:
        child = await asyncio.create_subprocess_exec(*command)
    except OSError as exc:
        print(f"gpufleet_endpoint relay: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _pass_on, child, sig)
    _remove(uds)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _relay(reader, writer, host, port)

    server = await asyncio.start_unix_server(handle, path=uds)
    try:
        code = await child.wait()
    finally:
        server.close()
        _remove(uds)
    return _status(code)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _pass_on(child: asyncio.subprocess.Process, sig: int) -> None:
    if child.returncode is None:
        child.send_signal(sig)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    return asyncio.run(run(args.uds, args.to, args.command))
