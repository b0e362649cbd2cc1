"""Image builds with the network: base environments (environments.py) and a job's packages
(packages.py), each made once per node and kept in podman's image store under its tag.

A build is a container of the image being extended, running the steps' script as root,
committed to the tag, then removed. What it may reach (services/node-agent/README.md,
"Packages", for why):

- network: `GPUFLEET_PACKAGE_BUILD_NETWORK`, by default `slirp4netns:allow_host_loopback=false`:
  its own user-mode stack, so nothing listening on the host's loopback (NATS, the
  agent's services) is reachable, nor other containers' networks;
- files: its image's alone (no volume, no device, not the agent's state nor a worker's);
- privileges: root in the container (apt and dpkg need it), with the capabilities package
  installs use (chown, file ownership and modes, setuid/setgid for apt's `_apt` sandbox,
  file capabilities) and no other, no new privileges, memory, pids and time limits.

One build per tag: a second worker that needs a tag being built waits for that build
(in this process, one task per tag; across agents on one host, a file lock per tag in
`build_dir`), then finds the image.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .packages import Step, failure_reason, script

BUILD_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "SETFCAP")
BUILD_LABEL = "gpufleet.build"

Podman = Callable[..., Awaitable[tuple[int, bytes, bytes]]]


@dataclass(frozen=True)
class BuildConfig:
    network: str = "slirp4netns:allow_host_loopback=false"
    memory_mb: int = 4096
    pids: int = 4096
    timeout_s: float = 1800.0
    index_url: str | None = None  # pip's index (GPUFLEET_PACKAGE_INDEX_URL); None: PyPI
    build_dir: Path = Path("/var/tmp/gpufleet-builds")  # locks and logs, one per tag


def _short(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()[:16]


def build_argv(name: str, from_image: str, steps: Sequence[Step], c: BuildConfig) -> list[str]:
    """`podman run` (attached) of the build container, less the leading `podman`."""
    return [
        "run",
        "--name",
        name,
        "--label",
        f"{BUILD_LABEL}={name}",
        "--network",
        c.network,
        "--user",
        "0:0",
        "--cap-drop",
        "ALL",
        "--cap-add",
        ",".join(BUILD_CAPS),
        "--security-opt",
        "no-new-privileges",
        "--memory",
        f"{c.memory_mb}m",
        "--memory-swap",
        f"{c.memory_mb}m",
        "--pids-limit",
        str(c.pids),
        "--pull",
        "never",
        "--entrypoint",
        "/bin/sh",
        from_image,
        "-c",
        script(steps, c.index_url),
    ]


def commit_argv(name: str, tag: str, config: Mapping[str, Any]) -> list[str]:
    """`podman commit` of the build to `tag`, with the image's own ENTRYPOINT and CMD back
    (the build replaced them), less the leading `podman`."""
    entrypoint = config.get("Entrypoint") or []
    cmd = config.get("Cmd") or []
    return [
        "commit",
        "--quiet",
        "--change",
        f"ENTRYPOINT {json.dumps(list(entrypoint))}",
        "--change",
        f"CMD {json.dumps(list(cmd))}",
        name,
        tag,
    ]


@dataclass
class Builder:
    """Builds images through `podman` (PodmanRuntime._podman); `built` lists the tags of
    the builds this process ran, in order (a cache hit runs none)."""

    podman: Podman
    podman_argv0: str
    env: Mapping[str, str]
    config: BuildConfig = field(default_factory=BuildConfig)
    built: list[str] = field(default_factory=list)
    _inflight: dict[str, asyncio.Future[str | None]] = field(default_factory=dict)

    async def exists(self, image: str) -> bool:
        rc, _, _ = await self.podman("image", "exists", image)
        return rc == 0

    async def ensure(
        self, tag: str, from_image: str, steps: Sequence[Step], say: Callable[[str], None]
    ) -> str | None:
        """None when `tag` is in the store, built now from `from_image` with `steps` if it
        is not; else why it could not be built. `say` gets progress lines for the worker."""
        if await self.exists(tag):
            return None
        task = self._inflight.get(tag)
        if task is None:
            task = asyncio.ensure_future(self._locked(tag, from_image, steps, say))
            self._inflight[tag] = task
            task.add_done_callback(lambda _: self._inflight.pop(tag, None))
        else:
            say(f"waiting for {tag}, being built for another worker")
        error = await asyncio.shield(task)
        if error is None:
            say(f"{tag} is ready")
        return error

    async def _locked(
        self, tag: str, from_image: str, steps: Sequence[Step], say: Callable[[str], None]
    ) -> str | None:
        self.config.build_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_path = self.config.build_dir / f"{_short(tag)}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _try_lock(fd):
                say(f"waiting for {tag}, being built by another agent on this host")
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            if await self.exists(tag):  # built meanwhile, by another agent
                return None
            say(f"building {tag} (once per node)")
            return await self._build(tag, from_image, steps)
        finally:
            os.close(fd)  # releases the lock

    async def _build(self, tag: str, from_image: str, steps: Sequence[Step]) -> str | None:
        name = f"gpufleet-build-{_short(tag)}"
        await self.podman("rm", "--force", name)  # what a crashed agent left
        rc, out, err = await self.podman("image", "inspect", "--format", "json", from_image)
        if rc != 0:
            return f"cannot build {tag}: image {from_image}: {err.decode(errors='replace')}"
        image_config = (json.loads(out or b"[{}]") or [{}])[0].get("Config") or {}
        log_path = self.config.build_dir / f"{_short(tag)}.log"
        self.built.append(tag)
        try:
            with log_path.open("w") as log_file:
                code, timed_out = await self._run(
                    build_argv(name, from_image, steps, self.config), log_file
                )
            output = log_path.read_text(errors="replace")
            if timed_out:
                return failure_reason(output, None, self.config.timeout_s)
            if code != 0:
                return failure_reason(output, code)
            rc, _, err = await self.podman(*commit_argv(name, tag, image_config))
            if rc != 0:
                return f"cannot commit {tag}: {err.decode(errors='replace').strip()[-500:]}"
            return None
        finally:
            await self.podman("rm", "--force", name)

    async def _run(self, argv: list[str], log_file: TextIO) -> tuple[int | None, bool]:
        proc = await asyncio.create_subprocess_exec(
            self.podman_argv0,
            *argv,
            env=dict(self.env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            return await asyncio.wait_for(proc.wait(), self.config.timeout_s), False
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return None, True


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
