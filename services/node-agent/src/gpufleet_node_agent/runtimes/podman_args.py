"""A worker's container, as plain data: from its spec to the exact `podman run` argv.

No I/O here (podman.py runs it). What a worker sees (services/node-agent/README.md):

- its image's filesystem (the job's own image, pulled by images.py, else the node's base
  image), and four directories of its own, bound from its worker directory:
  `/opt/ml/input` and `/opt/ml/models` read-only, `/opt/ml/checkpoint` and `/opt/ml/output`
  (ML_OUTPUT_PATH, its working directory) writable; nothing else of the host;
- a non-root user (`--user`), no capabilities, no new privileges;
- memory (swap included), CPU and pids limits;
- with the disk quota (steps/disk.py, on by default): its image's root read-only, and its writable
  directories (and /tmp, /var/tmp) on its own filesystem of `disk_size_gb`;
- the network the operator chose (`none` by default: no route to the control plane);
- its own GPUs, when they are real (gpu_access.py: their device nodes and the driver's
  libraries, or CDI), and for a fractional share its own MPS pipes (steps/share.py);
- its attached keys' files (steps/keys.py), read-only at /run/secrets;
- an endpoint's or a notebook's worker (steps/serve.py): its serve directory read-write at
  /run/gpufleet (the proxy's unix socket) and gpufleet's route server or relay read-only at
  /opt/gpufleet, still with no network; it may bind port 80 as its non-root user
  (`net.ipv4.ip_unprivileged_port_start=0`, in its own network namespace).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gpufleet_contracts.jobs import MountKind

from ..baseimage import BASE_IMAGE
from ..builds import BuildConfig
from ..host import mps
from ..host.gpu_access import GpuAccess
from ..images import qualified
from ..steps import disk, keys, serve
from ..worker.layout import MOUNTS_DIR, OUTPUT_DIR
from ..worker.spec import WorkerSpec
from .supervise import GPUFLEET_VARS, no_gpu_env, share_env

# The R-JOB-3/4 directories: (target in the container, read-only).
ML_DIRS = (
    ("/opt/ml/input", True),
    ("/opt/ml/models", True),
    ("/opt/ml/checkpoint", False),
    ("/opt/ml/output", False),
)
OUTPUT = "/opt/ml/output"
LABEL = "gpufleet"  # label prefix: gpufleet.minion, gpufleet.placement, ...
LOG_FILE = "container.log"  # conmon's k8s-file log, converted into `log` by the agent

# Names podman itself reads from its environment: a job's value for one of them cannot be
# handed over by name (`--env NAME`), it goes in a 0600 env file instead.
_PODMAN_NAMES = frozenset(
    {"PATH", "HOME", "TMPDIR", "TZ", "NOTIFY_SOCKET", "GODEBUG", "GOMAXPROCS", "GOGC"}
)
_PODMAN_PREFIXES = (
    "CONTAINERS_",
    "CONTAINER_",
    "XDG_",
    "STORAGE_",
    "BUILDAH_",
    "PODMAN_",
    "CONMON_",
    "DOCKER_",
    "REGISTRY_",
    "LISTEN_",
    "SSL_CERT_",
    "LD_",
    "_CONTAINERS_",
)


def podman_reads(name: str) -> bool:
    upper = name.upper()
    return (
        upper in _PODMAN_NAMES
        or upper.startswith(_PODMAN_PREFIXES)
        or upper.endswith("_PROXY")
        or upper == "NO_PROXY"
    )


def container_name(job_id: str, worker: int, placement_id: str) -> str:
    """`gpufleet-<job>-<worker>-<8 hex of the placement>`: readable in `podman ps`, unique per
    placement (a re-placed worker gets a new container)."""
    job = re.sub(r"[^A-Za-z0-9_.-]", "-", job_id)[:48].strip("-.") or "job"
    digest = hashlib.sha256(placement_id.encode()).hexdigest()[:8]
    return f"gpufleet-{job}-{int(worker)}-{digest}"


@dataclass(frozen=True)
class Bind:
    host: Path
    target: str
    read_only: bool

    def arg(self) -> str:
        return f"{self.host}:{self.target}:{'ro' if self.read_only else 'rw'}"


@dataclass(frozen=True)
class PodmanConfig:
    """The node's choices for every worker container (AgentSettings, `GPUFLEET_WORKER_*`)."""

    image: str = BASE_IMAGE
    uid: int = 10000  # the non-root user a worker runs as (gid the same)
    network: str = "none"
    memory_mb: int | None = None  # per worker; None: its GPUs' share of the node's
    cpus: float | None = None  # per worker; None: its GPUs' share of the node's
    pids: int = 4096
    stop_grace_s: int = 10
    containers_conf: Path | None = None
    podman: str = "podman"
    insecure_registries: tuple[str, ...] = ()  # host[:port] pulled without TLS checks
    disk_quota: bool = True  # writable space only on a filesystem of disk_size_gb (steps/disk.py)
    # R-JOB-7: the operator's images of base environments (environments.py), by env tag,
    # and how images with packages are built (builds.py)
    base_environments: Mapping[str, str] = field(default_factory=dict)
    build: BuildConfig = field(default_factory=BuildConfig)
    parallel: int = 4  # `podman run`s at once (podman_start.py)
    # who starts a worker's container: crun or runc under the shell supervisor (runc.py;
    # podman still pulls, builds and mounts images) or `podman run` (also where they cannot)
    launcher: str = "crun"


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    command: list[str]
    labels: dict[str, str]
    env: dict[str, str]  # gpufleet's values and the job's, all given to the container
    binds: list[Bind]
    devices: list[str]
    log_path: Path
    user: str
    network: str
    memory_mb: int
    cpus: float
    pids: int
    workdir: str = OUTPUT
    read_only: bool = False  # the image's root filesystem (--read-only)
    by_name: list[str] = field(default_factory=list)  # job env names passed by name
    in_file: list[str] = field(default_factory=list)  # job env names passed in the env file
    sysctls: dict[str, str] = field(default_factory=dict)  # its own network namespace's


def ml_binds(worker_dir: Path) -> list[Bind]:
    """The worker's own directories: <worker_dir>/mnt/opt/ml/..., and output/ (as the bare
    runtime's ML_OUTPUT_PATH) at /opt/ml/output."""
    out = []
    for target, read_only in ML_DIRS:
        host = worker_dir / OUTPUT_DIR if target == OUTPUT else worker_dir / MOUNTS_DIR / target[1:]
        out.append(Bind(host, target, read_only))
    return out


def quota_binds(worker_dir: Path) -> list[Bind]:
    """With the disk quota: the read-only directories as `ml_binds`, the writable ones (and
    /tmp, /var/tmp) from the worker's quota filesystem (steps/disk.py)."""
    on_disk = disk.binds(worker_dir)
    ro = [b for b in ml_binds(worker_dir) if b.read_only]
    return ro + [Bind(host, target, False) for target, host in on_disk.items()]


def mount_env(spec: WorkerSpec) -> dict[str, str]:
    """Each mount's variable, as the path inside the container (ML_DATA_PATH=/opt/ml/...)."""
    env = {}
    for m in spec.mounts:
        if m.kind is MountKind.output or not m.env or not m.target.startswith("/"):
            continue
        env[m.env] = str(PurePosixPath("/", *[p for p in m.target.split("/") if p]))
    return env


def container_env(spec: WorkerSpec, real_gpus: bool) -> dict[str, str]:
    """gpufleet's variables, which the job's env cannot override (as in `worker_env`)."""
    indices = spec.gpu_indices
    # Real GPUs: the container has only its own device nodes, which CUDA numbers from 0.
    visible = range(len(indices)) if real_gpus else indices
    env = {
        "JOB_NAME": spec.job_name,
        "JOB_ID": spec.job_id,
        "WORKER_NUMBER": str(spec.worker),
        "ML_OUTPUT_PATH": OUTPUT,
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in visible),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **no_gpu_env(indices),
    }
    env.update(mount_env(spec))
    env.update(share_env(spec))
    if spec.output_archive:
        env["ML_OUTPUT_ARCHIVE"] = spec.output_archive
    if spec.key_types:
        env[keys.ENV_NAME] = keys.CONTAINER_PATH
    return env


def key_binds(spec: WorkerSpec, worker_dir: Path) -> list[Bind]:
    """Its attached keys' files (steps/keys.py), read-only at /run/secrets; none without keys."""
    if not spec.key_types:
        return []
    return [Bind(keys.host_path(worker_dir), keys.CONTAINER_PATH, True)]


def serve_binds(spec: WorkerSpec, worker_dir: Path) -> list[Bind]:
    """An endpoint's serve directory (read-write: its socket) and gpufleet's server code
    with its routes (read-only), as a reserved job's (its port's socket, the relay); none
    for another job."""
    if spec.serving is None and not serve.relays_port(spec):
        return []
    return [
        Bind(worker_dir / serve.SERVE_DIR, serve.IN_SERVE, False),
        Bind(worker_dir / serve.ENDPOINT_DIR, serve.IN_ENDPOINT, True),
    ]


# An endpoint's own server listens on port 80 as the worker's non-root user; the sysctl is
# per network namespace, and the container has its own.
SERVE_SYSCTLS = {"net.ipv4.ip_unprivileged_port_start": "0"}


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    cpus: float


def share_limits(
    config: PodmanConfig,
    node_gpus: int,
    worker_gpus: int,
    *,
    node_memory_mb: int | None = None,
    node_cpus: int | None = None,
    cpu_job_cpus: int = 0,
    cpu_count: int = 0,
) -> Limits:
    """A worker's memory and CPUs (README "CPU-only jobs").

    A CPU-only worker (`cpu_count`, R-JOB-2): the CPUs it reserved, and the same share of
    the node's memory (the configured memory if set). A GPU worker: the configured ones, or
    else its GPUs' share of what the node keeps for GPU work: its CPUs less the `cpu_job_cpus`
    offered to CPU-only jobs, and that part of its memory (one share at least; all of it
    without GPUs)."""
    if node_memory_mb is None:
        node_memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    node_cpus = node_cpus or os.cpu_count() or 1
    if cpu_count > 0:
        part = min(cpu_count / node_cpus, 1.0)
        return Limits(config.memory_mb or max(256, int(node_memory_mb * part)), float(cpu_count))
    gpu_cpus = max(1, node_cpus - cpu_job_cpus)
    share = max(1, worker_gpus) / node_gpus if node_gpus > 0 else 1.0
    share = min(share, 1.0)
    memory = config.memory_mb or max(256, int(node_memory_mb * gpu_cpus / node_cpus * share))
    cpus = config.cpus or max(1.0, round(gpu_cpus * share, 2))
    return Limits(memory, cpus)


def container_spec(
    spec: WorkerSpec,
    worker_dir: Path,
    minion_id: str,
    config: PodmanConfig,
    *,
    job_env: Mapping[str, str] | None = None,
    gpu: GpuAccess | None = None,
    mps_pipe: Path | None = None,
    limits: Limits | None = None,
    image: str | None = None,
    reserved_port: int | None = None,
) -> ContainerSpec:
    """The container of the worker of `spec` (`job_env`: its env values), in `image` (the
    image step's: its environment, with its packages) or else its spec's image or the
    node's base image; `gpu`: how this node's real GPUs reach a container; `mps_pipe`: its
    share's MPS pipes (the share step's); `reserved_port`: its port reservation's, which
    the job listens on (the reservation step's)."""
    gpu = gpu or GpuAccess.none()
    indices = list(spec.gpu_indices)
    ours = container_env(spec, gpu.real)
    ours.update(gpu.env(indices))
    binds = quota_binds(worker_dir) if config.disk_quota else ml_binds(worker_dir)
    binds += key_binds(spec, worker_dir)
    binds += serve_binds(spec, worker_dir)
    binds += [Bind(b.host, b.target, True) for b in gpu.library_binds(indices)]
    if mps_pipe is not None:
        binds.append(Bind(mps_pipe, mps.MPS_TARGET, False))
        ours.update(mps.share_env())
    job = {k: v for k, v in (job_env or {}).items() if k not in ours and k not in GPUFLEET_VARS}
    defaults = {"HOME": "/tmp"}  # the worker's user has no home in the image
    env = {**defaults, **job, **ours}
    placement = spec.placement_id
    limits = limits or Limits(config.memory_mb or 4096, config.cpus or 1.0)
    labels = {
        f"{LABEL}.minion": minion_id,
        f"{LABEL}.placement": placement,
        f"{LABEL}.job": spec.job_id,
        f"{LABEL}.worker": str(spec.worker),
        f"{LABEL}.dir": str(worker_dir),
    }
    in_file = sorted(k for k in job if podman_reads(k))
    by_name = sorted(k for k in job if not podman_reads(k))
    return ContainerSpec(
        name=container_name(spec.job_id, spec.worker, placement),
        image=image or (qualified(spec.image) if spec.image else config.image),
        command=serve.command(spec, as_root=config.uid == 0, reserved_port=reserved_port),
        labels=labels,
        env=env,
        binds=binds,
        devices=gpu.devices(indices),
        log_path=worker_dir / LOG_FILE,
        user=f"{config.uid}:{config.uid}",
        network=config.network,
        memory_mb=limits.memory_mb,
        cpus=limits.cpus,
        pids=config.pids,
        read_only=config.disk_quota,
        by_name=by_name,
        in_file=in_file,
        sysctls=dict(SERVE_SYSCTLS) if spec.serving is not None else {},
    )


def run_argv(
    c: ContainerSpec,
    podman: str = "podman",
    env_file: Path | None = None,
    conmon_pidfile: Path | None = None,
) -> list[str]:
    """`podman run -d ...` for `c`. Env values of the job are never in the argv: names whose
    value podman takes from its own environment (`--env NAME`), and `env_file` for names
    podman reads itself. gpufleet's own variables are given with their values.
    `conmon_pidfile`: where conmon writes its pid (the agent watches it to hear of the end)."""
    # --init: catatonit is PID 1, so the command gets SIGTERM on a stop (a PID 1 without a
    # handler ignores it) and its orphans are reaped.
    argv = [podman, "run", "--detach", "--init", "--name", c.name]
    if conmon_pidfile is not None:
        argv += ["--conmon-pidfile", str(conmon_pidfile)]
    for k, v in c.labels.items():
        argv += ["--label", f"{k}={v}"]
    argv += [
        "--user",
        c.user,
        "--workdir",
        c.workdir,
        "--network",
        c.network,
        "--memory",
        f"{c.memory_mb}m",
        "--memory-swap",
        f"{c.memory_mb}m",  # the same: no swap beyond the limit
        "--cpus",
        f"{c.cpus:g}",
        "--pids-limit",
        str(c.pids),
        "--security-opt",
        "no-new-privileges",
        "--cap-drop",
        "ALL",
        "--log-driver",
        "k8s-file",
        "--log-opt",
        f"path={c.log_path}",
    ]
    if c.read_only:
        argv += ["--read-only"]  # writes go to the quota'd binds (or the memory's tmpfs)
    for b in c.binds:
        argv += ["--volume", b.arg()]
    for d in c.devices:
        argv += ["--device", d]
    for k, v in c.sysctls.items():
        argv += ["--sysctl", f"{k}={v}"]
    if env_file is not None and c.in_file:
        argv += ["--env-file", str(env_file)]
    for name in c.by_name:
        argv += ["--env", name]
    ours = {k: v for k, v in c.env.items() if k not in c.by_name and k not in c.in_file}
    for k, v in ours.items():
        argv += ["--env", f"{k}={v}"]
    return [*argv, c.image, *c.command]


def convert_k8s_log(raw: bytes) -> tuple[bytes, int]:
    """conmon's k8s-file lines (`<time> <stream> <F|P> <text>`) to the plain bytes the
    command wrote; and how many bytes of `raw` that used (complete lines only)."""
    end = raw.rfind(b"\n") + 1
    out = bytearray()
    for line in raw[:end].splitlines():
        parts = line.split(b" ", 3)
        if len(parts) < 3:
            continue
        out += parts[3] if len(parts) == 4 else b""
        if parts[2] != b"P":  # P: a partial line, continued by the next record
            out += b"\n"
    return bytes(out), end
