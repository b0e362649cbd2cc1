"""Starting a container with `podman run --detach` (where crun and runc cannot: runc.py),
for the podman runtime's launch (podman.py): the job's env values handed over without
reaching podman's argv, conmon's pid file and working directory set where the runtime
watches them.

At most `PodmanConfig.parallel` `podman run`s at once (each is ~0.2-0.4 s, mostly waiting
for storage and runc: one after another a node could start only ~3 containers a second,
issue 15). Once a container runs, its conmon is watched (its pid from `--conmon-pidfile`,
procwatch.py): conmon exits once the container has ended and podman has recorded it, which
is when the runtime asks podman how it ended.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping

from ..worker.workdir import Worker
from .podman_args import ContainerSpec, run_argv

MARKER = "container.json"
ENV_FILE = "podman.env"
CONMON_PID = "conmon.pid"

Podman = Callable[..., Awaitable[tuple[int, bytes, bytes]]]


async def podman_run(
    podman: Podman, c: ContainerSpec, w: Worker, executable: str, env: Mapping[str, str]
) -> tuple[int, bytes, bytes]:
    """`podman run` of `c` for `w`: the job's values by name from podman's own environment
    (`env` and them), or, for names podman itself reads, in a 0600 env file deleted as soon
    as podman has returned."""
    run_env = dict(env)
    run_env.update({k: c.env[k] for k in c.by_name})
    env_file = w.file(ENV_FILE) if c.in_file else None
    if env_file is not None:
        bad = [k for k in c.in_file if "\n" in c.env[k]]
        if bad:
            return 1, b"", f"env {bad}: a multi-line value under a name podman reads".encode()
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{k}={c.env[k]}\n" for k in c.in_file)
    try:
        # conmon, started by `podman run`, keeps its working directory: where it writes
        # an `oom` file when the kernel kills the container for memory (podman.py).
        argv = run_argv(c, executable, env_file, w.file(CONMON_PID))[1:]
        return await podman(*argv, env=run_env, cwd=w.dir)
    finally:
        if env_file is not None:
            env_file.unlink(missing_ok=True)
