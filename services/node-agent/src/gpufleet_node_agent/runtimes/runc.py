"""Containers started by an OCI runtime (crun, else runc) under the worker's shell
supervisor, not by `podman run`.

Issue 15: `podman run` costs ~0.23 CPU-s a container on this kind of machine (podman
itself, conmon, `podman container cleanup`, `podman ps`/`rm` shares); runc alone ~0.02.
podman still does what it is good at, once per image and node: it pulls and builds images
(images.py, prepare.py) and makes each image's **node root**: one container created from
the image (`gpufleet-root-<hash>`, never run) and mounted, with the mount points a worker
needs, a passwd entry for the worker's uid and a hosts file written into it. Every worker
of that image runs on that root, read-only (the disk quota's binds, disk.py, hold what it
writes), each in its own namespaces: nothing of one worker is visible to another.

Per worker: its bundle, `<bundles>/<container>/config.json` (oci.py; 0600, holds the job's
env values: removed once runc has created the container; on tmpfs, beside the runtimes'
own state, so the values never reach the node's disk), then
`sh -c SUPERVISOR gpufleet-worker <dir> -- runc run --keep ...` in a session of its own
(supervise.py): runc stays in the foreground as the container's parent, passes its stdout
and stderr (the worker's `log`, plain bytes) and the signals it gets to catatonit (PID 1),
and exits with the command's status, which the shell writes to `exit`. Like a bare
worker's, the shell outlives an agent restart and is watched with a pidfd. Once it is gone
the agent reads the container's OOM count from its cgroup (`--keep` leaves it), runs
`runc delete`, releases the disk quota and writes exit.json.

crun (the default where it can: README "crun, in cgroups of the agent's"): the same, but
`crun run` has no `--keep`, so it runs with its cgroup manager off in cgroups the agent made
(cgroupv1.py), which the supervisor's subshell joins before it execs crun; the agent reads the
OOM count from them and removes them once the supervisor is gone.

Files of the worker directory, beside the supervisor's (supervise.py):

    runc.json        {name, image, runtime: "crun" | "runc"}: written before the supervisor
                     starts (no runtime: runc, an older agent's)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..worker.files import read_int, read_json, write_json_atomic, write_text_atomic
from ..worker.workdir import SPAWNED, Worker, supervisor_alive
from . import cgroupv1, oci, procwatch, seccomp_bpf
from .execfail import not_executed
from .podman_args import ML_DIRS, ContainerSpec, container_name
from .supervise import end_fields, supervisor_argv

log = logging.getLogger("gpufleet.node_agent.runc")

MARKER = "runc.json"
BUNDLES = Path("/run/gpufleet-agent/bundles")
OLD_BUNDLE = "bundle"  # where an older agent wrote a worker's bundle, in its directory
CATATONIT = Path("/usr/libexec/podman/catatonit")
SECCOMP_JSON = Path("/usr/share/containers/seccomp.json")
DEFAULT_ROOT = Path("/run/gpufleet-agent/runc")
CRUN_ROOT = Path("/run/gpufleet-agent/crun")
APPARMOR = Path("/sys/module/apparmor/parameters/enabled")
SELINUX = Path("/sys/fs/selinux/enforce")
OOM = "out of memory"

Podman = Callable[..., Awaitable[tuple[int, bytes, bytes]]]


@dataclass(frozen=True)
class NodeRoot:
    """An image made ready for runc on this node: its mounted root, env and entrypoint."""

    image_id: str
    path: Path
    env: dict[str, str]
    entrypoint: list[str]

    def there(self) -> bool:
        """Still mounted (a `podman rm --all` or a reboot takes it away)?"""
        return (self.path / "etc").is_dir()


def root_name(image_id: str) -> str:
    return f"gpufleet-root-{hashlib.sha256(image_id.encode()).hexdigest()[:16]}"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def problem(runc: str | None = None) -> str | None:
    """Why this node cannot start containers with runc (podman then starts them), or None.
    Where AppArmor or SELinux is on, podman confines each container with its profile or
    label; runc.py does not, so podman starts them there: never a weaker container."""
    if shutil.which(runc or "runc") is None:
        return "runc is not installed"
    return confinement_problem()


def crun_problem(crun: str = "crun") -> str | None:
    """Why crun cannot start this node's containers (runc then does), or None."""
    if shutil.which(crun) is None:
        return "crun is not installed"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing"
    return confinement_problem() or cgroupv1.Cgroups.here()[1]


def confinement_problem() -> str | None:
    """What the OCI runtimes here cannot give a container that podman would."""
    if not CATATONIT.exists():
        return f"{CATATONIT} is missing (Debian's catatonit, a podman dependency)"
    with contextlib.suppress(OSError):
        if APPARMOR.read_text().strip().upper().startswith("Y"):
            return "AppArmor is enabled (podman applies its profile to each container)"
    if SELINUX.exists():
        return "SELinux is enabled (podman labels each container)"
    if not SECCOMP_JSON.exists():
        return f"{SECCOMP_JSON} is missing (containers' seccomp profile)"
    return None


class Runc:
    """The OCI-runtime half of PodmanRuntime: node roots, launching (runc, or crun where
    `crun` is set), stopping, collecting ends. Each worker's runtime is in its marker, so a
    restarted agent ends the containers of an earlier one whatever it is set to now."""

    def __init__(
        self,
        podman: Podman,
        uid: int,
        root: Path = DEFAULT_ROOT,
        binary: str = "runc",
        *,
        crun: bool = False,
        crun_root: Path = CRUN_ROOT,
        crun_binary: str = "crun",
        bundles: Path = BUNDLES,
    ):
        self.podman = podman
        self.uid = uid
        self.root = root
        self.binary = shutil.which(binary) or binary
        self.crun_root = crun_root
        self.crun_binary = shutil.which(crun_binary) or crun_binary
        self.use_crun = crun
        self.bundles = bundles
        self._cgroups: cgroupv1.Cgroups | None = None
        self._runtimes: dict[str, str] = {}  # placement -> "runc" | "crun"
        self._forgotten: set[str] = set()  # placements whose config.json is gone
        self._state_files: dict[str, Path] = {}  # placement -> its runtime's state file
        self._roots: dict[str, NodeRoot] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._seccomp: dict[str, Any] | None = None
        self._bpf: str | None = None  # _precompiled(): None not tried yet, "" unavailable
        if SECCOMP_JSON.exists():
            self._seccomp = oci.seccomp(json.loads(SECCOMP_JSON.read_text()))
        self._kill_at: dict[str, asyncio.TimerHandle] = {}

    # --- which containers ------------------------------------------------------------

    @staticmethod
    def unsuited(c: ContainerSpec) -> str | None:
        """Why podman, not runc, must start `c` (None: runc can)."""
        if not c.read_only:
            return "a writable root (no disk quota) needs podman's overlay"
        if c.network != "none":
            return f"network {c.network!r} needs podman's"
        if oci.device_nodes(c.devices) is None:
            return "CDI devices need podman"
        return None

    @staticmethod
    def ours(w: Worker) -> bool:
        return w.file(MARKER).exists()

    # --- node roots ------------------------------------------------------------------

    async def node_root(self, image: str, check: bool = False) -> NodeRoot | str:
        """The image's node root (made once per node and image), or why it cannot be.
        `check`: the reference may name another image now (a job's image, pulled again just
        before): ask podman which, and make that image's root if it is a new one."""
        known = self._roots.get(image)
        if known is not None and not check and known.there():
            return known
        async with self._locks.setdefault(image, asyncio.Lock()):
            rc, out, err = await self.podman("image", "inspect", "--format", "json", image)
            if rc != 0 or not out.strip():
                why = err.decode(errors="replace").strip()
                return f"image {image} is not on this node: {why}"
            info = json.loads(out)[0]
            known = self._roots.get(image)
            if known is not None and known.image_id == info.get("Id") and known.there():
                return known
            made = await self._make_root(image, info)
            if isinstance(made, NodeRoot):
                self._roots[image] = made
            return made

    async def _make_root(self, image: str, info: dict[str, Any]) -> NodeRoot | str:
        config = info.get("Config") or {}
        env = dict(str(e).partition("=")[::2] for e in config.get("Env") or [])
        entrypoint = [str(a) for a in config.get("Entrypoint") or []]
        image_id = str(info.get("Id") or image)
        name = root_name(image_id)
        # Created once per node (another agent of this host may have made it: then it is
        # there already); never started, only mounted.
        await self.podman(
            "create", "--name", name, "--label", "gpufleet.node-root=1", image_id, "true"
        )
        rc, out, err = await self.podman("mount", name)
        if rc != 0:
            return f"cannot mount image {image}: {err.decode(errors='replace').strip()}"
        path = Path(out.decode().strip())
        await asyncio.to_thread(self._prepare_root, path)
        log.info("node root of %s at %s", image, path)
        return NodeRoot(image_id, path, env, entrypoint)

    def _prepare_root(self, path: Path) -> None:
        """What every worker needs of the image's root: its mount points, the worker's user
        and the loopback name (podman writes the last two per container)."""
        for target in ("proc", "sys", "dev", "run", "tmp", "var/tmp"):
            (path / target).mkdir(parents=True, exist_ok=True)
        for target, _ in ML_DIRS:
            (path / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
        etc = path / "etc"
        etc.mkdir(exist_ok=True)
        self._add_line(
            etc / "passwd", f":{self.uid}:", f"gpufleet:x:{self.uid}:{self.uid}::/tmp:/bin/sh"
        )
        self._add_line(etc / "group", f":{self.uid}:", f"gpufleet:x:{self.uid}:")
        self._add_line(etc / "hosts", "localhost", "127.0.0.1\tlocalhost\n::1\tlocalhost")
        self._add_line(etc / "hosts", oci.HOSTNAME, f"127.0.1.1\t{oci.HOSTNAME}")

    @staticmethod
    def _add_line(path: Path, present: str, line: str) -> None:
        try:
            text = path.read_text()
        except OSError:
            text = ""
        if any(present in existing for existing in text.splitlines()):
            return
        if text and not text.endswith("\n"):
            text += "\n"
        path.write_text(f"{text}{line}\n")

    # --- launching -------------------------------------------------------------------

    def launch(
        self, w: Worker, c: ContainerSpec, root: NodeRoot, notify: Callable[[], None]
    ) -> str | None:
        """Write its bundle and start its supervisor; None, or why it could not start."""
        devices = oci.device_nodes(c.devices) or []
        config = oci.oci_config(
            c,
            root.path,
            init=CATATONIT,
            image_env=root.env,
            entrypoint=root.entrypoint,
            devices=devices,
            seccomp_profile=self._seccomp,
        )
        runtime = "crun" if self.use_crun else "runc"
        precompiled = self._precompiled() if runtime == "crun" else None
        if precompiled is not None:
            # crun installs it as is and compiles nothing; the profile it was compiled from
            # (SECCOMP_JSON, as oci.seccomp builds it) is then left out of config.json
            config["annotations"][seccomp_bpf.ANNOTATION] = precompiled
            config["linux"].pop("seccomp", None)
        bundle = self.bundle(w)
        self.bundles.mkdir(mode=0o700, parents=True, exist_ok=True)
        bundle.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(bundle / "config.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(config))  # one-shot: C (json.dump to a file is pure Python)
        self._runtimes[w.placement_id] = runtime
        write_json_atomic(w.file(MARKER), {"name": c.name, "image": c.image, "runtime": runtime})
        join: list[Path] = []  # the cgroups the supervisor's command joins before it execs
        if runtime == "crun":
            try:
                argv, join = self._crun_argv(c.name, bundle, config)
            except OSError as exc:
                return f"cannot make the container's cgroups: {exc}"
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            argv = [
                self.binary,
                "--root",
                str(self.root),
                "run",
                "--keep",
                "--bundle",
                str(bundle),
                c.name,
            ]
        with w.file("log").open("ab") as out:
            try:
                proc = subprocess.Popen(
                    supervisor_argv(w.dir, argv, join),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.DEVNULL,
                    env={"PATH": os.environ.get("PATH", os.defpath)},
                    cwd=w.dir,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                return f"cannot start runc: {exc}"
        w.proc = proc
        SPAWNED.append(proc)
        write_text_atomic(w.file("supervisor.pid"), f"{proc.pid}\n")
        write_json_atomic(
            w.file("started.json"), {"pid": proc.pid, "started_at": _now(), "container": c.name}
        )
        self.watch(w, notify)
        return None

    def _crun_argv(
        self, name: str, bundle: Path, config: dict[str, Any]
    ) -> tuple[list[str], list[Path]]:
        """crun with its cgroup manager off, and the cgroups made here (cgroupv1.py) that
        its supervisor's command joins before it execs it (supervise.py)."""
        cgroups = self.cgroups()
        res = config["linux"]["resources"]
        limits = cgroupv1.Limits(
            memory_bytes=int(res["memory"]["limit"]),
            cpu_quota_us=int(res["cpu"]["quota"]),
            cpu_period_us=int(res["cpu"]["period"]),
            pids=int(res["pids"]["limit"]),
            devices=[(d["major"], d["minor"]) for d in config["linux"]["devices"]],
        )
        procs = cgroups.make(name, limits)
        self.crun_root.mkdir(parents=True, exist_ok=True)
        run = [
            *self._crun(),
            "run",
            "--no-subreaper",
            "--bundle",
            str(bundle),
            name,
        ]
        if cgroups.hybrid:  # its own mount namespace, where the v2 mount is hidden
            run = [*cgroupv1.hide_unified(), *run]
        return run, procs

    def _precompiled(self) -> str | None:
        """The node's seccomp filter compiled once, for crun's annotation (seccomp_bpf.py),
        or None: crun compiles it for each container."""
        if self._bpf is None:
            self._bpf = ""
            if self._seccomp is not None:
                try:
                    self._bpf = seccomp_bpf.annotation(self._seccomp)
                except (seccomp_bpf.Unavailable, KeyError, TypeError, ValueError) as exc:
                    log.warning("crun compiles each container's seccomp filter: %s", exc)
        return self._bpf or None

    def _crun(self) -> list[str]:
        return [self.crun_binary, "--cgroup-manager=disabled", "--root", str(self.crun_root)]

    def cgroups(self) -> cgroupv1.Cgroups:
        if self._cgroups is None:
            found, why = cgroupv1.Cgroups.here()
            if found is None:
                raise OSError(why)
            self._cgroups = found
        return self._cgroups

    def runtime(self, w: Worker) -> str:
        """Who started its container (its marker says; an older agent's: runc)."""
        known = self._runtimes.get(w.placement_id)
        if known is None:
            marker = read_json(w.file(MARKER)) or {}
            known = "crun" if marker.get("runtime") == "crun" else "runc"
            self._runtimes[w.placement_id] = known
        return known

    def watch(self, w: Worker, notify: Callable[[], None]) -> bool:
        """Hear of its end at once (pidfd); False when it is gone already or unwatchable."""
        pid = read_int(w.file("supervisor.pid"))
        if pid is None or not self.alive(w):
            return False
        return procwatch.watch(pid, notify)

    def alive(self, w: Worker) -> bool:
        """Is its supervisor still there (and so may still write `exit`)?"""
        if w.proc is not None:
            return w.proc.poll() is None
        pid = read_int(w.file("supervisor.pid"))
        return pid is not None and supervisor_alive(pid, w.dir)

    @staticmethod
    def name(w: Worker) -> str:
        """Its container's name, as container_spec names it (no file read per round)."""
        return container_name(w.job_id, w.worker, w.placement_id)

    def bundle(self, w: Worker) -> Path:
        """Its OCI bundle: only its config.json, which holds the job's env values until the
        runtime has read it. On tmpfs (/run), like the runtimes' own state: the values
        never reach the node's disk, and a job costs the disk no directory to make and
        remove (issue 15)."""
        return self.bundles / self.name(w)

    def keep_only(self, active: set[str]) -> None:
        """Forget what is remembered of placements no longer active (one lost without an
        end, say: no `delete` came for it)."""
        self._forgotten &= active
        for known in (self._state_files, self._runtimes):
            for gone in known.keys() - active:
                del known[gone]

    def forget_config(self, w: Worker) -> None:
        """The job's env values are deleted once runc has created the container."""
        p = w.placement_id
        if p in self._forgotten:
            return
        config = self.bundle(w) / "config.json"
        if not config.exists():
            config = w.dir / OLD_BUNDLE / "config.json"
        if config.exists() and not self._created(w) and self.alive(w):
            return  # not read yet
        config.unlink(missing_ok=True)
        self._forgotten.add(p)
        self._state_files.pop(p, None)  # asked for until now only

    def _state(self, w: Worker) -> Path:
        """The runtime's state directory of its container."""
        return (self.crun_root if self.runtime(w) == "crun" else self.root) / self.name(w)

    def _created(self, w: Worker) -> bool:
        """Has the runtime created its container (and so read its config)? Its state file,
        written then (the directory is made before the config is read)."""
        path = self._state_files.get(w.placement_id)
        if path is None:
            crun = self.runtime(w) == "crun"
            path = self._state(w) / ("status" if crun else "state.json")
            self._state_files[w.placement_id] = path
        return path.exists()

    # --- stopping --------------------------------------------------------------------

    def stop(self, w: Worker, grace_s: float) -> None:
        """SIGTERM through runc to the container's PID 1, SIGKILL after `grace_s`."""
        pid = read_int(w.file("supervisor.pid"))
        if pid is None or not self.alive(w):
            return
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)  # runc forwards it to catatonit, which to the job
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            old = self._kill_at.pop(w.placement_id, None)
            if old is not None:
                old.cancel()
            self._kill_at[w.placement_id] = loop.call_later(grace_s, self.kill, w)

    def kill(self, w: Worker) -> None:
        """End it now: the container (its PID 1, so all of it), then its supervisor."""
        self._kill_at.pop(w.placement_id, None)
        if self.runtime(w) == "crun":
            with contextlib.suppress(OSError):
                self.cgroups().kill(self.name(w))
        else:
            self._runc("kill", self.name(w), "KILL")
        pid = read_int(w.file("supervisor.pid"))
        if pid is not None and self.alive(w):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def _runc(self, *args: str) -> int:
        return _quiet([self.binary, "--root", str(self.root), *args])

    # --- ends ------------------------------------------------------------------------

    def oom_killed(self, w: Worker) -> bool:
        """Did the kernel kill it for memory? Its memory cgroup's count (`--keep` left it;
        crun's are the agent's own)."""
        name = self.name(w)
        if self.runtime(w) == "crun":
            try:
                return self.cgroups().oom_killed(name)
            except OSError:
                return False
        state = read_json(self.root / name / "state.json") or {}
        memory = (state.get("cgroup_paths") or {}).get("memory") or (
            state.get("cgroup_paths") or {}
        ).get("")
        if not memory:
            return False
        for fname in ("memory.oom_control", "memory.events"):
            with contextlib.suppress(OSError):
                for line in (Path(memory) / fname).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                        return True
        return False

    def end_fields(self, w: Worker) -> dict[str, Any] | None:
        """Its end, from the supervisor's `exit` (None without one), and its container
        deleted. Call once the supervisor is gone."""
        fields = end_fields(w.dir)
        name = self.name(w)
        timer = self._kill_at.pop(w.placement_id, None)
        if timer is not None:
            timer.cancel()
        if fields is not None:
            fields["container"] = name
            if not fields.get("stopped") and self.oom_killed(w):
                fields.update(reason=OOM, oom_killed=True)
            elif fields.get("exit_code") == 1:  # catatonit's, when the command is not there
                fields.update(not_executed(w))
        self.delete(w)
        return fields

    def delete(self, w: Worker) -> None:
        """Its runtime's state and cgroups removed (the container killed first if need be)."""
        name = self.name(w)
        if self.runtime(w) == "crun":
            self._delete_crun(w, name)
        else:
            self._runc("delete", "--force", name)
        shutil.rmtree(self.bundle(w), ignore_errors=True)
        shutil.rmtree(w.dir / OLD_BUNDLE, ignore_errors=True)
        self._runtimes.pop(w.placement_id, None)
        self._forgotten.discard(w.placement_id)
        self._state_files.pop(w.placement_id, None)

    def _delete_crun(self, w: Worker, name: str) -> None:
        """`crun run` removes its state as it returns: only a crun that was killed leaves
        it. The cgroups are the agent's: removed here, their processes killed first."""
        try:
            cgroups = self.cgroups()
        except OSError as exc:
            log.warning("crun container %s: %s", name, exc)
            return
        cgroups.kill(name)
        if not cgroups.remove(name):
            log.warning("crun container %s: its cgroups are still busy", name)
        if self._state(w).exists():
            _quiet([*self._crun(), "delete", "--force", name])


def _quiet(argv: list[str]) -> int:
    try:
        return subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False
        ).returncode
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("%s: %s", " ".join(argv), exc)
        return -1
