"""Being told when a process ends, without polling: a pidfd (Linux 5.3+) in the event loop.

A pidfd becomes readable when its process has ended, whoever its parent is, so the agent
hears of a worker's end at once, also after a restart, when the process is no longer its
child. Where pidfds are missing (older kernels, another OS) `watch` says so and the caller
falls back on its periodic check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable


def watch(pid: int, on_exit: Callable[[], None]) -> bool:
    """Call `on_exit()` once, from the running event loop, when `pid` has ended (at once if
    it has already). False when it cannot be watched (no pidfd, or no running loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        loop.call_soon(on_exit)
        return True
    except (AttributeError, OSError):
        return False

    def fired() -> None:
        loop.remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        on_exit()

    loop.add_reader(fd, fired)
    return True
