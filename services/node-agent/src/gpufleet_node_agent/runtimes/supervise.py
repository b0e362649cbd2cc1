"""How a bare-process worker is supervised: a tiny shell per worker, no Python process.

The agent starts `/bin/sh -c SUPERVISOR gpufleet-worker <worker_dir> -- <command...>` in a
session of its own (stdin /dev/null, stdout the worker's `log`, stderr /dev/null: the
command's stderr goes to the log, the shell's own messages, "Terminated", do not), with the worker's
environment (`worker_env`) and `<worker_dir>/output` as its working directory. The shell is
the leader of the worker's process group (its pid is the group's id); it runs the command
in the foreground, writes the command's exit status to `<worker_dir>/exit` (one small
write), then SIGKILLs what the command left in the group, itself included. It costs about a
millisecond of CPU (the Python supervisor it replaces cost ~67 ms a job, issue 15) and it
outlives the agent (`kill -9` or a restart): the agent watches it (a pidfd when it can,
procwatch.py; /proc otherwise), and once the shell is gone turns `exit` into `exit.json`
(`end_fields`). A shell gone without `exit` is a lost worker (or a stopped one: see below).

The shell traps the catchable signals a job may send its own process group (`kill 0`), so
only the command gets them; a trap (unlike an ignored signal) is not inherited, so the
command starts with the default dispositions. Stopping (process.py): SIGTERM to the group,
SIGKILL after the grace period; the agent keeps the grace period's clock.

Files of the worker directory it concerns (the rest: worker/manager.py):

    supervisor.pid  the shell (the group), written by the agent when it starts it
    started.json    {pid: the group, started_at}, written by the agent when it starts it
    log             the command's stdout and stderr, appended
    output/         ML_OUTPUT_PATH, also the command's working directory
    exit            the command's exit status, written by the shell (its mtime: the end)
    exit.json       {exit_code, ended_at, signal?, stopped?, error?}: the agent's record

Workers of an agent before this one ran under `python -m gpufleet_node_agent.supervise`
(SUPERVISOR_MODULE), which wrote exit.json itself; a restarted agent still recognises them.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet_contracts.jobs import MountKind

from ..steps.keys import ENV_NAME, SECRETS_DIR
from ..worker.layout import MOUNTS_DIR as MOUNTS_DIR
from ..worker.layout import OUTPUT_DIR, mount_dir
from ..worker.spec import STOP_GRACE_S as STOP_GRACE_S
from ..worker.spec import WorkerSpec

# Set by gpufleet; a job's own env cannot override them.
GPUFLEET_VARS = (
    "JOB_NAME",
    "JOB_ID",
    "WORKER_NUMBER",
    "ML_OUTPUT_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
)


SHELL = "/bin/sh"
NAME = "gpufleet-worker"  # the shell's $0: with the worker's directory, how it is recognised
SUPERVISOR_MODULE = "gpufleet_node_agent.supervise"  # an older agent's Python supervisor
EXIT_FILE = "exit"
# $1 is the worker's directory, the command follows `--`. The subshell execs the command (no
# second fork) with its stderr on the log, while the shell's own ("Terminated") stays on
# /dev/null. `kill -9 0` ends the shell too: after `exit` is written, so a shell that is
# gone without it was killed.
SUPERVISOR = """trap : HUP INT QUIT TERM USR1 USR2 ALRM
d=$1; shift
(while [ "$1" != -- ]; do printf '0\\n' > "$1" || exit 125; shift; done; shift; exec "$@") 2>&1
printf '%d\\n' "$?" > "$d/exit"
kill -9 0
"""
# Before the command, the subshell joins each `cgroup.procs` named before `--` (crun's
# containers' cgroups, runc.py; none for a bare worker): "0" is the writing process, itself
# (no `$$` in a subshell, no launcher process). It exits 125 without running the command when
# it cannot join one.
CANNOT_JOIN = 125


def supervisor_argv(
    worker_dir: Path, command: Sequence[str], cgroup_procs: Sequence[Path] = ()
) -> list[str]:
    joins = [str(p) for p in cgroup_procs]
    return [SHELL, "-c", SUPERVISOR, NAME, str(worker_dir), *joins, "--", *command]


def is_supervisor(args: Sequence[str], worker_dir: Path) -> bool:
    """Are `args` (a /proc cmdline) this worker's supervisor, of this agent or an older one?"""
    if str(worker_dir) not in args:
        return False
    return (len(args) > 4 and args[3] == NAME and args[4] == str(worker_dir)) or (
        SUPERVISOR_MODULE in args
    )


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def end_fields(worker_dir: Path) -> dict[str, Any] | None:
    """exit.json's fields from the shell's `exit` file; None without one. A status above
    128 is reported as the shell reports it, killed by signal status-128 (a command that
    exits 137 itself reads the same: a shell cannot tell them apart)."""
    path = worker_dir / EXIT_FILE
    try:
        text = path.read_text().strip()
        ended = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return None
    try:
        code = int(text)
    except ValueError:
        return {"exit_code": None, "ended_at": ended.isoformat(), "error": f"bad exit {text!r}"}
    fields: dict[str, Any] = {"exit_code": code, "ended_at": ended.isoformat()}
    if 128 < code < 128 + 65:
        fields.update(signal=code - 128, signal_name=_signal_name(code - 128))
    if (worker_dir / "stop_requested").exists():
        fields["stopped"] = True
    return fields


def mount_dirs(spec: WorkerSpec, worker_dir: Path) -> dict[str, Path]:
    """Where each mount of the plan lives on this node, by its env variable (R-JOB-3/4).

    Without containers there are no bind mounts: each target (/opt/ml/input/...) is a
    directory under the worker's directory, and the worker finds it through the mount's
    variable (ML_DATA_PATH, ML_CHECKPOINT_PATH, ML_MODEL_PATH, ...). The output mount is
    the worker's output directory (ML_OUTPUT_PATH)."""
    out: dict[str, Path] = {}
    for m in spec.mounts:
        if m.kind is MountKind.output or not m.target.startswith("/") or not m.env:
            continue
        out[m.env] = mount_dir(worker_dir, m.target)
    return out


def share_env(spec: WorkerSpec) -> dict[str, str]:
    """A fractional GPU (R-SCHED-4): the share and its memory limit, for the worker and for
    CUDA MPS (thread percentage; pinned memory limit of its one visible device)."""
    fraction = spec.gpu_fraction
    if fraction is None:
        return {}
    env = {
        "GPU_FRACTION": str(fraction),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(float(fraction) * 100))),
    }
    limit = spec.gpu_memory_limit_mb
    if limit:
        env["GPU_MEMORY_LIMIT_MB"] = str(int(limit))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={int(limit)}M"
    return env


def no_gpu_env(gpu_indices: Sequence[int]) -> dict[str, str]:
    """A worker without GPUs (a CPU-only job, R-JOB-2) sees none: CUDA_VISIBLE_DEVICES is
    empty (CUDA: no device), and NVIDIA_VISIBLE_DEVICES=void, so an NVIDIA container
    toolkit hook, where the runtime has one, injects no GPU either."""
    return {} if gpu_indices else {"NVIDIA_VISIBLE_DEVICES": "void"}


def worker_env(
    spec: WorkerSpec,
    worker_dir: Path,
    base: Mapping[str, str],
    job_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The command's environment: the supervisor's own (less the agent's GPUFLEET_*
    settings, which may hold credentials), then the job's env (`job_env`: its values, from
    env.json), then gpufleet's variables."""
    env = {k: v for k, v in base.items() if not k.startswith("GPUFLEET_")}
    env.update(job_env or {})
    env.update(
        JOB_NAME=spec.job_name,
        JOB_ID=spec.job_id,
        WORKER_NUMBER=str(spec.worker),
        ML_OUTPUT_PATH=str(worker_dir / OUTPUT_DIR),
        CUDA_VISIBLE_DEVICES=",".join(str(i) for i in spec.gpu_indices),
        # CUDA's default order is "fastest first"; PCI order is the one NVML's indices use.
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
    )
    env.pop("NVIDIA_VISIBLE_DEVICES", None)  # a job never picks GPUs itself
    env.update(no_gpu_env(spec.gpu_indices))
    env.update({k: str(v) for k, v in mount_dirs(spec, worker_dir).items()})
    env.update(share_env(spec))
    if spec.output_archive:
        env["ML_OUTPUT_ARCHIVE"] = spec.output_archive
    if spec.key_types:  # its attached keys' files (steps/keys.py)
        env[ENV_NAME] = str(worker_dir / SECRETS_DIR)
    return env
