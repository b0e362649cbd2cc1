"""Node agent: a worker's container as plain data (podman_args), and conmon's log format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet_node_agent.baseimage import BASE_IMAGE
from gpufleet_node_agent.host.gpu_access import GpuAccess, HostGpu, LibBind
from gpufleet_node_agent.runtimes.podman_args import (
    PodmanConfig,
    container_name,
    container_spec,
    convert_k8s_log,
    podman_reads,
    run_argv,
    share_limits,
)
from gpufleet_node_agent.worker.spec import WorkerSpec

WD = Path("/state/workers/pl-1")


def spec(**kw: Any) -> WorkerSpec:
    return WorkerSpec.model_validate(
        {
            "placement_id": "pl-1",
            "job_id": "job-1",
            "job_name": "demo",
            "worker": 0,
            "command": ["python3", "train.py", "--epochs", "3"],
            "gpu_indices": [1, 3],
            "mounts": [
                {
                    "target": "/opt/ml/input/data",
                    "kind": "dataset",
                    "source": {"kind": "platform", "asset": "dataset", "name": "d"},
                    "env": "ML_DATA_PATH",
                },
                {"target": "/opt/ml/output", "kind": "output", "env": "ML_OUTPUT_PATH"},
            ],
            **kw,
        }
    )


CONFIG = PodmanConfig(memory_mb=2048, cpus=1.5, pids=512)
# Two of a node's GPUs whose device minors are not their NVML indices, and one driver library.
GPUS = GpuAccess(
    "devices",
    {1: HostGpu(1, 5, "GPU-aa"), 3: HostGpu(3, 2, "GPU-bb")},
    (
        LibBind(
            Path("/usr/lib/libcuda.so.580.1"),
            "/usr/local/nvidia/lib64/libcuda.so.1",
        ),
    ),
)


def test_the_exact_argv_of_a_worker_with_real_gpus_and_a_job_env() -> None:
    c = container_spec(
        spec(),
        WD,
        "m1",
        CONFIG,
        job_env={"API_TOKEN": "s3cret", "PATH": "/opt/bin:/usr/bin", "JOB_ID": "forged"},
        gpu=GPUS,
    )
    name = container_name("job-1", 0, "pl-1")
    assert run_argv(c, "podman", WD / "podman.env") == [
        "podman", "run", "--detach", "--init", "--name", name,
        "--label", "gpufleet.minion=m1",
        "--label", "gpufleet.placement=pl-1",
        "--label", "gpufleet.job=job-1",
        "--label", "gpufleet.worker=0",
        "--label", f"gpufleet.dir={WD}",
        "--user", "10000:10000",
        "--workdir", "/opt/ml/output",
        "--network", "none",
        "--memory", "2048m",
        "--memory-swap", "2048m",
        "--cpus", "1.5",
        "--pids-limit", "512",
        "--security-opt", "no-new-privileges",
        "--cap-drop", "ALL",
        "--log-driver", "k8s-file",
        "--log-opt", f"path={WD}/container.log",
        "--read-only",  # the image's root: writes go to the quota filesystem (disk.py)
        "--volume", f"{WD}/mnt/opt/ml/input:/opt/ml/input:ro",
        "--volume", f"{WD}/mnt/opt/ml/models:/opt/ml/models:ro",
        "--volume", f"{WD}/disk/output:/opt/ml/output:rw",
        "--volume", f"{WD}/disk/checkpoint:/opt/ml/checkpoint:rw",
        "--volume", f"{WD}/disk/tmp:/tmp:rw",
        "--volume", f"{WD}/disk/var-tmp:/var/tmp:rw",
        # the driver's libraries, one file at a time, read-only
        "--volume", "/usr/lib/libcuda.so.580.1:/usr/local/nvidia/lib64/libcuda.so.1:ro",
        "--device", "/dev/nvidia5",  # GPU 1's device node is its minor number's
        "--device", "/dev/nvidia2",
        "--device", "/dev/nvidiactl",
        "--device", "/dev/nvidia-uvm",
        "--device", "/dev/nvidia-uvm-tools",
        "--env-file", f"{WD}/podman.env",
        "--env", "API_TOKEN",  # its value comes from podman's environment, never the argv
        "--env", "HOME=/tmp",
        "--env", "JOB_NAME=demo",
        "--env", "JOB_ID=job-1",  # the job's own JOB_ID is dropped
        "--env", "WORKER_NUMBER=0",
        "--env", "ML_OUTPUT_PATH=/opt/ml/output",
        "--env", "CUDA_VISIBLE_DEVICES=0,1",  # its two device nodes, as CUDA numbers them
        "--env", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "--env", "ML_DATA_PATH=/opt/ml/input/data",
        "--env", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64",
        BASE_IMAGE,
        "python3", "train.py", "--epochs", "3",
    ]  # fmt: skip
    assert (c.by_name, c.in_file) == (["API_TOKEN"], ["PATH"])  # PATH: in the 0600 env file
    assert "s3cret" not in " ".join(run_argv(c))


def test_without_the_disk_quota_the_root_is_writable_and_the_binds_on_the_host() -> None:
    c = container_spec(spec(), WD, "m1", PodmanConfig(disk_quota=False))
    argv = run_argv(c)
    assert "--read-only" not in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"] == [
        f"{WD}/mnt/opt/ml/input:/opt/ml/input:ro",
        f"{WD}/mnt/opt/ml/models:/opt/ml/models:ro",
        f"{WD}/mnt/opt/ml/checkpoint:/opt/ml/checkpoint:rw",
        f"{WD}/output:/opt/ml/output:rw",
    ]


def test_simulated_gpus_give_no_devices_and_keep_the_placement_indices() -> None:
    c = container_spec(spec(gpu_fraction="0.5", gpu_memory_limit_mb=12000), WD, "m1", CONFIG)
    argv = run_argv(c)
    assert "--device" not in argv and "--env-file" not in argv
    assert "CUDA_VISIBLE_DEVICES=1,3" in argv
    assert "GPU_MEMORY_LIMIT_MB=12000" in argv and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in argv


def test_a_container_is_named_per_placement_and_safely() -> None:
    assert container_name("job 1/ä", 2, "pl-1") == container_name("job 1/ä", 2, "pl-1")
    assert container_name("job-1", 0, "pl-1") != container_name("job-1", 0, "pl-2")
    assert container_name("job 1/ä", 2, "pl-1").startswith("gpufleet-job-1-2-")


def test_limits_default_to_the_share_of_the_node_its_gpus_are() -> None:
    unset = PodmanConfig()
    half = share_limits(unset, 4, 2, node_memory_mb=64000, node_cpus=16)
    assert (half.memory_mb, half.cpus) == (32000, 8.0)
    zero = share_limits(unset, 4, 0, node_memory_mb=64000, node_cpus=16)
    assert (zero.memory_mb, zero.cpus) == (16000, 4.0)  # one share
    no_gpus = share_limits(unset, 0, 0, node_memory_mb=8000, node_cpus=2)
    assert (no_gpus.memory_mb, no_gpus.cpus) == (8000, 2.0)
    assert share_limits(CONFIG, 4, 1, node_memory_mb=64000, node_cpus=16).memory_mb == 2048


def test_a_cpu_only_worker_gets_its_cpus_and_their_share_of_memory() -> None:
    """R-JOB-2: `--cpus cpu_count`, memory in proportion; GPU workers share what the node
    keeps for GPU work (its CPUs less those offered to CPU-only jobs)."""
    unset = PodmanConfig()
    cpu = share_limits(unset, 2, 0, node_memory_mb=64000, node_cpus=32, cpu_count=8)
    assert (cpu.memory_mb, cpu.cpus) == (16000, 8.0)
    gpu = share_limits(unset, 2, 1, node_memory_mb=64000, node_cpus=32, cpu_job_cpus=16)
    assert (gpu.memory_mb, gpu.cpus) == (16000, 8.0)  # half of the 16 CPUs kept, and of 32 GB
    # the operator's per-worker memory holds for CPU-only workers too; their CPUs do not move
    fixed = share_limits(CONFIG, 2, 0, node_memory_mb=64000, node_cpus=32, cpu_count=8)
    assert (fixed.memory_mb, fixed.cpus) == (2048, 8.0)


def test_a_cpu_only_worker_sees_no_gpu() -> None:
    s = spec(gpu_indices=[], cpu_count=8)
    c = container_spec(
        s,
        WD,
        "m1",
        PodmanConfig(),
        job_env={"NVIDIA_VISIBLE_DEVICES": "all"},
        gpu=GPUS,
        limits=share_limits(PodmanConfig(), 2, 0, node_memory_mb=8000, node_cpus=16, cpu_count=8),
    )
    assert c.devices == []
    assert c.env["CUDA_VISIBLE_DEVICES"] == "" and c.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    argv = run_argv(c)
    assert argv[argv.index("--cpus") + 1] == "8" and argv[argv.index("--memory") + 1] == "4000m"
    assert "NVIDIA_VISIBLE_DEVICES=all" not in argv and "--device" not in argv
    gpu = container_spec(spec(), WD, "m1", PodmanConfig(), gpu=GPUS)
    assert "NVIDIA_VISIBLE_DEVICES" not in gpu.env


def test_names_podman_reads_itself_are_recognised() -> None:
    assert all(map(podman_reads, ["PATH", "HOME", "CONTAINERS_CONF", "https_proxy", "TMPDIR"]))
    assert not any(
        map(
            podman_reads,
            ["API_TOKEN", "HF_TOKEN", "WANDB_API_KEY", "MY_PATH", "GOOGLE_CREDENTIALS"],
        )
    )


def test_conmon_log_lines_become_the_bytes_the_command_wrote() -> None:
    raw = (
        b"2026-01-01T00:00:00.1+00:00 stdout F hello\n"
        b"2026-01-01T00:00:00.2+00:00 stderr P par\n"
        b"2026-01-01T00:00:00.3+00:00 stderr F tial\n"
        b"2026-01-01T00:00:00.4+00:00 stdout F \n"
        b"2026-01-01T00:00:00.5+00:00 stdout F not yet compl"
    )
    data, used = convert_k8s_log(raw)
    assert data == b"hello\npartial\n\n"
    assert raw[used:] == b"2026-01-01T00:00:00.5+00:00 stdout F not yet compl"


def test_attached_keys_are_bound_read_only_at_run_secrets_and_named_by_secrets_path() -> None:
    plain = container_spec(spec(), WD, "m1", CONFIG)
    assert not any(b.target == "/run/secrets" for b in plain.binds)
    assert "SECRETS_PATH" not in plain.env
    c = container_spec(spec(key_types=["huggingface"]), WD, "m1", CONFIG)
    assert f"{WD}/secrets:/run/secrets:ro" in run_argv(c)
    assert c.env["SECRETS_PATH"] == "/run/secrets"


def test_a_reserved_job_runs_under_the_relay_from_its_port_socket_still_without_network() -> None:
    """R-RES-3: the node serves the reservation's port on its LAN to serve/port.sock; the
    relay takes each connection on to the port the job listens on in its container."""
    reserved = spec(reservation={"region": "lab", "name": "web"})
    c = container_spec(reserved, WD, "m1", CONFIG, reserved_port=8080)
    relay = ["python3", "/opt/gpufleet/run.py", "relay", "--uds", "/run/gpufleet/port.sock"]
    assert c.command == [
        *relay,
        "--to",
        "127.0.0.1:8080",
        "--",
        "python3",
        "train.py",
        "--epochs",
        "3",
    ]
    argv = run_argv(c)
    assert f"{WD}/serve:/run/gpufleet:rw" in argv
    assert f"{WD}/endpoint:/opt/gpufleet:ro" in argv
    assert argv[argv.index("--network") + 1] == "none"
    # the port not known (yet): its own command; a job without a reservation: nothing added
    assert container_spec(reserved, WD, "m1", CONFIG).command == list(reserved.command)
    plain = container_spec(spec(), WD, "m1", CONFIG, reserved_port=8080)
    assert plain.command == ["python3", "train.py", "--epochs", "3"]
    assert not any(b.target == "/run/gpufleet" for b in plain.binds)
