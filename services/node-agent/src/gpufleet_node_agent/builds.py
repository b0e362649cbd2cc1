"""Image builds with the network: base environments (environments.py) and a job's packages
(packages.py), each made once per node and kept in podman's image store under its tag.

A build is a container of the image being extended, running the steps' script as root,
committed to the tag, then removed. What it may reach (services/node-agent/README.md,
"Packages", for why):

- network: `GPUFLEET_PACKAGE_BUILD_NETWORK`, by default `slirp4netns:allow_host_loopback=false`:
  its own user-mode stack, so nothing listening on the host's loopback (NATS, the
  agent's services) is reachable, nor other containers' networks; and in its own network
  namespace an nftables table (buildnet.py), put there between `podman init` and `podman
  start`, which refuses this host's addresses, the control plane's, and private, link-local
  and loopback ranges but the operator's index and list. A build whose network cannot be
  confined so does not run;
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
import ipaddress
import json
import os
import shutil
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from . import buildnet
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
    allow: tuple[buildnet.Target, ...] = ()  # GPUFLEET_PACKAGE_BUILD_ALLOW
    control_plane: tuple[str, ...] = ()  # the NATS servers' URLs: never reachable
    proc: Path = Path("/proc")  # where this host's addresses are read (buildnet.py)


@dataclass(frozen=True)
class BuildRun:
    """How a build container ended: its exit code, or killed at the timeout, or never
    started (`error`: it could not be created or its network confined)."""

    code: int | None = None
    timed_out: bool = False
    error: str | None = None


def _short(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()[:16]


def build_argv(name: str, from_image: str, steps: Sequence[Step], c: BuildConfig) -> list[str]:
    """`podman create` of the build container, less the leading `podman`."""
    return container_argv(name, from_image, ["/bin/sh", "-c", script(steps, c.index_url)], c)


def container_argv(name: str, image: str, command: Sequence[str], c: BuildConfig) -> list[str]:
    """`podman create` of a container with a build's settings running `command` (its
    ENTRYPOINT replaced by `command[0]`), less the leading `podman`. `Builder.run` starts
    it once its network is confined."""
    return [
        "create",
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
        command[0],
        image,
        *command[1:],
    ]


def index_target(index_url: str | None) -> buildnet.Target | None:
    """The operator's index as a host and port a build may reach."""
    if not index_url:
        return None
    parts = urlsplit(index_url)
    if not parts.hostname:
        return None
    return buildnet.Target(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


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
                run = await self.run(
                    name, build_argv(name, from_image, steps, self.config), log_file
                )
            if run.error is not None:
                return f"cannot build {tag}: {run.error}"
            output = log_path.read_text(errors="replace")
            if run.timed_out:
                return failure_reason(output, None, self.config.timeout_s)
            if run.code != 0:
                return failure_reason(output, run.code)
            rc, _, err = await self.podman(*commit_argv(name, tag, image_config))
            if rc != 0:
                return f"cannot commit {tag}: {err.decode(errors='replace').strip()[-500:]}"
            return None
        finally:
            await self.podman("rm", "--force", name)

    async def run(self, name: str, create: list[str], log_file: TextIO) -> BuildRun:
        """Create the container `create` (`container_argv`) describes, confine its network,
        then start it attached, its output to `log_file`. The caller removes it."""
        rc, _, err = await self.podman(*create)
        if rc == 0:
            rc, _, err = await self.podman("init", name)
        if rc != 0:
            return BuildRun(error=err.decode(errors="replace").strip()[-500:])
        problem = await self._confine(name)
        if problem is not None:
            return BuildRun(error=f"cannot confine the build's network: {problem}")
        code, timed_out = await self._run(["start", "--attach", name], log_file)
        return BuildRun(code, timed_out)

    async def egress(self, resolv_conf: str) -> buildnet.Egress:
        """Where this build may connect (buildnet.py), host names resolved now."""
        allowed: list[buildnet.Allowed] = []
        index = index_target(self.config.index_url)
        for target in (*((index,) if index else ()), *self.config.allow):
            if target.network is not None:
                allowed.append(buildnet.Allowed(target.network))
            elif target.host is not None:
                for a in await _resolve(target.host):
                    allowed.append(buildnet.Allowed(ipaddress.ip_network(a), target.port))
        control: list[buildnet.Address] = []
        for url in self.config.control_plane:
            host = urlsplit(url if "://" in url else f"nats://{url}").hostname
            control += await _resolve(host) if host else []
        own = buildnet.host_addresses(
            _read(self.config.proc / "net" / "fib_trie"),
            _read(self.config.proc / "net" / "if_inet6"),
        )
        return buildnet.egress(allowed, own, control, buildnet.nameservers(resolv_conf))

    async def _confine(self, name: str) -> str | None:
        """Put the egress table in the network namespace of the created (`podman init`)
        container `name`, before it runs anything; why not, or None."""
        nsenter = shutil.which("nsenter", path=self.env.get("PATH"))
        nft = shutil.which("nft", path=self.env.get("PATH"))
        if nsenter is None or nft is None:
            return "nsenter (util-linux) and nft (nftables) are needed on this node"
        rc, out, err = await self.podman("inspect", "--format", "json", name)
        state = (json.loads(out or b"[{}]") or [{}])[0] if rc == 0 else {}
        pid = int((state.get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            return f"no process for {name}: {err.decode(errors='replace').strip()[-300:]}"
        resolv = _read(Path(str(state.get("ResolvConfPath") or "/nonexistent")))
        rules = buildnet.ruleset(await self.egress(resolv))
        proc = await asyncio.create_subprocess_exec(
            nsenter,
            f"--net=/proc/{pid}/ns/net",
            nft,
            "-f",
            "-",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await proc.communicate(rules.encode())
        if proc.returncode != 0:
            return f"nft failed ({proc.returncode}): {output.decode(errors='replace').strip()}"
        return None

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


async def _resolve(host: str) -> list[buildnet.Address]:
    """The addresses `host` resolves to here (none when it does not)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    found = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    return list(dict.fromkeys(found))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
