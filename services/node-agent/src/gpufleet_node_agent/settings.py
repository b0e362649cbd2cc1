"""Settings of the node agent, from `GPUFLEET_*` environment variables."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .baseimage import BASE_IMAGE
from .buildnet import parse_allow
from .environments import parse_env_map
from .host.mdns import parse_interfaces
from .proxy.hosts import UrlTemplate, parse_listen
from .staging.datastores import parse_roots

# A minion id becomes one NATS subject token and part of a durable consumer name.
MINION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def default_minion_id() -> str:
    """The host name, made subject-safe ("gpu-01.lab" -> "gpu-01-lab")."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()).strip("-")
    return name[:64] or "node"


def default_sim_inventory() -> Path:
    """The packaged simulated inventory: two RTX 3090."""
    packaged = resources.files("gpufleet_node_agent").joinpath("simulated", "2x-rtx3090.json")
    return Path(str(packaged))


ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"", "0", "false", "no", "off"})


def simulated_gpus_file(value: object) -> Path | None:
    """What `GPUFLEET_SIMULATED_GPUS` asks for: None (unset, 0/false/no/off), the packaged
    2 x RTX 3090 (1/true/yes/on), or the simulated inventory file it names."""
    if value is None or value is False:
        return None
    if value is True:
        return default_sim_inventory()
    text = str(value).strip()
    if text.lower() in OFF:
        return None
    if text.lower() in ON:
        return default_sim_inventory()
    path = Path(text).expanduser()
    if not path.is_file():
        raise ValueError(f"{text!r} is neither on/off (1/true, 0/false) nor a file")
    return path


# Replaced by GPUFLEET_SIMULATED_GPUS. They are no longer read; the agent warns when it sees
# them, because a node that silently loses its simulated GPUs is hard to explain.
RETIRED = ("GPUFLEET_FORCE_SIMULATED", "GPUFLEET_SIM_INVENTORY")


def retired_settings(env: Mapping[str, str]) -> list[str]:
    return [name for name in RETIRED if name in env]


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    minion_id: str = Field(default_factory=default_minion_id)
    node_name: str = ""  # empty: the minion id
    region: str = "local"
    account: str = "local"  # the node's owner
    # Development and tests only: report the GPUs of a simulated inventory file, never
    # NVML's. None: real GPUs through NVML, or none without an NVIDIA driver (R-NODE-6).
    simulated_gpus: Path | None = None
    agent_state_dir: Path = Path("~/.local/state/gpufleet-agent")
    heartbeat_s: float = Field(default=5.0, gt=0)
    # Workers' ends come as events (procwatch.py); while workers run, their new log is
    # shipped every worker_poll_s (reading files only), and every worker_check_s a
    # safety-net round checks on each of them (podman: one `podman ps`).
    worker_poll_s: float = Field(default=0.5, gt=0)
    worker_check_s: float = Field(default=5.0, gt=0)
    price_per_gpu_hour: Decimal | None = Field(default=None, ge=0)
    # R-SCHED-4: the operator divides each GPU of this node into this many shares.
    gpu_shares: int = Field(default=1, ge=1, le=16)
    # CPU-only jobs (R-JOB-2, README "CPU-only jobs"): the logical CPUs this node offers them
    # (None: all of a node without GPUs, none of a GPU node); the rest feed its GPUs' workers.
    cpu_job_cpus: int | None = Field(default=None, ge=0, le=1024)
    price_per_cpu_hour: Decimal | None = Field(default=None, ge=0)  # to other accounts
    log_chunk_bytes: int = Field(default=16384, ge=256, le=1024 * 1024)
    # A worker's output kept on the node and shipped, at most (logcap.py): past it, one
    # notice, and the node frees what the job goes on printing.
    worker_log_max_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024, le=2**40)
    # A worker's output archive whose upload failed stays on the node, under
    # <agent_state_dir>/kept-outputs/<placement>/, this long (pruned at start and hourly).
    kept_outputs_hours: float = Field(default=24.0, ge=0)
    # Enrolment (R-NODE-2): a one-time join token, exchanged at the first start for the
    # node's own credential, kept in `<agent_state_dir>/node.creds` (GPUFLEET_NATS_CREDS
    # overrides the path). The token, or a file holding it.
    join_token: str | None = Field(default=None, repr=False)
    join_token_file: Path | None = None
    # How workers run (policy.py; README "Runtime policy"). Every worker runs in a container
    # of the container runtime (`podman`: podman.py, podman_args.py). `own-jobs`: the
    # operator's explicit opt-in to run the jobs of this node's owner (owner and creator)
    # as bare host processes under a supervisor, as the agent's user (process.py); another
    # account's job never does.
    worker_runtime: Literal["podman"] = "podman"
    allow_bare_processes: Literal["no", "own-jobs"] = "no"
    worker_image: str = BASE_IMAGE  # built from Debian packages when missing
    worker_uid: int = Field(default=10000, ge=1)  # non-root user (and group) in containers
    worker_network: str = "none"  # podman --network; `none`: no route anywhere
    worker_memory_mb: int | None = Field(default=None, ge=16)  # None: the GPUs' share
    worker_cpus: float | None = Field(default=None, gt=0)  # None: the GPUs' share
    worker_pids: int = Field(default=4096, ge=16)
    podman_parallel: int = Field(default=4, ge=1, le=64)  # `podman run`s at once
    # Who starts a worker's container (README "Launching containers"): `crun` or `runc`,
    # under the worker's shell supervisor on the image's node root (runc.py; crun falls back
    # to runc where it cannot: cgroupv1.py), or `podman` (`podman run`). podman still pulls
    # and builds images either way, and starts the containers the OCI runtimes are not given
    # (no disk quota, another network, CDI devices).
    container_launcher: Literal["crun", "runc", "podman"] = "crun"
    # A container worker's writable space (README "Disk quota"): `loop`, its own loop-mounted
    # ext4 of disk_size_gb and a read-only image root; `off`: unlimited, on the host's disk.
    worker_disk_quota: Literal["loop", "off"] = "loop"
    # Registries (host[:port]) a job's image is pulled from without TLS checks: only ones
    # the operator runs on a trusted network, e.g. `just up`'s local registry. Comma-separated.
    worker_insecure_registries: str = ""
    # Real GPUs in containers (gpu_access.py): `auto` (CDI when its spec is installed, else
    # device nodes + the driver's libraries), `cdi` or `devices`.
    gpu_access: Literal["auto", "cdi", "devices"] = "auto"
    nvidia_driver_dir: Path | None = None  # `devices`: where libcuda.so.1 is (else found)
    mps_control: str | None = None  # nvidia-cuda-mps-control (else found on PATH / driver dirs)
    # The shares' MPS pipes and logs (mps.py): every directory above must be o+x, since the
    # MPS server runs as the workers' uid.
    mps_dir: Path = Path("/run/gpufleet-agent/mps")
    # R-JOB-7 (README "Base environments and packages"): operator images of base
    # environments, `py3.10-pytorch-2.1=registry/env:tag,...`; pip's index for package
    # builds (None: PyPI); the network, memory and time of a build container.
    base_environments: str = ""
    package_index_url: str | None = None
    package_build_network: str = "slirp4netns:allow_host_loopback=false"
    # What a build may reach beyond the internet (buildnet.py): networks or host:port, e.g.
    # a LAN apt mirror `10.1.2.3:80`; the package index is allowed without being listed.
    package_build_allow: str = ""
    package_build_memory_mb: int = Field(default=4096, ge=256)
    package_build_timeout_s: float = Field(default=1800.0, gt=0)
    # The containers.conf podman runs with (CONTAINERS_CONF); None: deploy/podman/ of the
    # source checkout, when there is one.
    podman_containers_conf: Path | None = None
    # A node that goes with its agent (`just up`): when the agent stops, it stops its
    # workers (containers, disks, MPS daemons) and reports them stopped before it exits.
    # Off, the default: workers outlive the agent and a restarted one re-attaches them.
    stop_workers_on_exit: bool = False
    # Staging (README "Staging"): what a worker's data may be fetched from although it is
    # not a public address (loopback, private, link-local...: refused against SSRF), as
    # `host:port` or networks, comma-separated (`just up --data` names its servers); a CA
    # file trusted besides the system's for https (Azurite, a local web server; for git it
    # replaces the system's); the GCS emulator's URL (the only GCS reached without a key).
    staging_allow: str = ""
    staging_ca_file: Path | None = None
    staging_gcs_endpoint: str | None = None
    # The node's content cache (README "Cache"), under <agent_state_dir>/staging-cache/:
    # what its entries may hold at most (least recently used evicted past it); 0: off.
    staging_cache_bytes: int = Field(default=50 * 1024**3, ge=0)
    # The region's datastores on this node (README "Regional datastores", R-RES-2): each
    # one's root directory here (the NFS or SMB share the operator mounted), as
    # `name=/abs/root,name2=/root2`; a job's `regional_datastore` path is copied from under it.
    regional_datastores: str = ""
    # The datastores this node mounts for its workers (README "Regional resources"): by the
    # kernel (`kernel`: mount -t nfs / cifs; the agent needs root or CAP_SYS_ADMIN), or by
    # bind-mounting `<datastore_bind_root>/<address>/<root path>` in their place (`bind`:
    # development and tests, where no NFS or SMB client or server can run). Each mount is
    # probed every `datastore_probe_s` (a probe bounded by `datastore_probe_timeout_s`), so a
    # server that stops answering is seen within their sum (keep it under 60 s) and mounted
    # again; a worker waits `datastore_wait_s` for one that does not answer, then fails.
    datastore_mounter: Literal["kernel", "bind"] = "kernel"
    datastore_bind_root: Path | None = None
    datastore_probe_s: float = Field(default=20.0, gt=0)
    datastore_probe_timeout_s: float = Field(default=10.0, gt=0)
    datastore_wait_s: float = Field(default=600.0, ge=0)
    # The interfaces (names, comma-separated) on whose addresses this node publishes its
    # workers' port reservations with mDNS (R-RES-3): the region's LAN, never a container
    # bridge (refused at start-up). Empty: it publishes none (a reserved job fails here).
    mdns_interfaces: str = ""
    # Endpoints (README "Endpoints: the proxy and its trust model"): where the node's proxy
    # listens (`host:port`; 0.0.0.0 for a node others reach; `off`: no proxy, the node
    # serves no endpoint URL), the URL template it registers (one origin per job; empty:
    # `http://{job}.localhost:<port>`, https with a certificate), the certificate and key
    # it serves https with, and how long a request to an endpoint still starting is held.
    proxy_listen: str = "127.0.0.1:8480"
    proxy_url: str = ""
    proxy_cert: Path | None = None
    proxy_key: Path | None = None
    proxy_hold_s: float = Field(default=60.0, ge=0, le=600)

    def proxy_template(self) -> str:
        """The URL template the proxy registers (GPUFLEET_PROXY_URL, else the default)."""
        if self.proxy_url:
            return self.proxy_url
        port = self.proxy_listen.rpartition(":")[2]
        scheme = "https" if self.proxy_cert else "http"
        return f"{scheme}://{{job}}.localhost:{port}"

    def token(self) -> str | None:
        if self.join_token:
            return self.join_token
        if self.join_token_file is not None:
            return self.join_token_file.expanduser().read_text().strip()
        return None

    @field_validator("minion_id")
    @classmethod
    def _subject_safe(cls, value: str) -> str:
        if not MINION_ID_RE.fullmatch(value):
            raise ValueError(
                f"minion_id {value!r} must be 1-64 letters, digits, '-' or '_' "
                "(it is a NATS subject token)"
            )
        return value

    @field_validator("agent_state_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @model_validator(mode="after")
    def _proxy(self) -> AgentSettings:
        if self.proxy_listen.strip().lower() == "off":
            return self
        parse_listen(self.proxy_listen)
        UrlTemplate.parse(self.proxy_template())
        if (self.proxy_cert is None) != (self.proxy_key is None):
            raise ValueError("GPUFLEET_PROXY_CERT and GPUFLEET_PROXY_KEY go together")
        return self

    @field_validator("worker_runtime", mode="before")
    @classmethod
    def _no_bare_default(cls, value: object) -> object:
        if str(value).strip().lower() == "process":
            raise ValueError(
                "`process` is no longer a worker runtime: every worker runs in a container; "
                "to run this node owner's own jobs as bare processes, set "
                "GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs"
            )
        return value

    @field_validator("allow_bare_processes", mode="before")
    @classmethod
    def _bare_choice(cls, value: object) -> object:
        text = str(value).strip().lower()
        return "no" if text in OFF else text

    @field_validator("base_environments")
    @classmethod
    def _env_map(cls, value: str) -> str:
        parse_env_map(value)  # refused at start-up, not at a job's
        return value

    @field_validator("regional_datastores")
    @classmethod
    def _datastore_roots(cls, value: str) -> str:
        parse_roots(value)  # refused at start-up, not at a job's
        return value

    @field_validator("mdns_interfaces")
    @classmethod
    def _mdns_interfaces(cls, value: str) -> str:
        parse_interfaces(value)  # a bridge is refused at start-up
        return value

    @field_validator("package_build_allow")
    @classmethod
    def _build_allow(cls, value: str) -> str:
        parse_allow(value)  # refused at start-up, not at a build
        return value

    @field_validator("package_build_network")
    @classmethod
    def _build_network(cls, value: str) -> str:
        mode = value.strip().split(":")[0]
        if mode in ("host", "container", "ns", "pod"):
            raise ValueError(
                f"GPUFLEET_PACKAGE_BUILD_NETWORK {value!r}: a build needs a network namespace "
                "of its own (its egress is filtered there): slirp4netns, none, or a podman "
                "network"
            )
        return value

    @field_validator("simulated_gpus", mode="before")
    @classmethod
    def _simulated(cls, value: object) -> Path | None:
        return simulated_gpus_file(value)

    @model_validator(mode="after")
    def _default_name(self) -> AgentSettings:
        if not self.node_name:
            self.node_name = self.minion_id
        return self
