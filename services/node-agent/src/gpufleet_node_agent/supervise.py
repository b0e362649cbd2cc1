"""The supervisor of one worker: `python -m gpufleet_node_agent.supervise <worker_dir>`.

The agent starts it detached (its own session, stdio on /dev/null), so the worker outlives
an agent restart or `kill -9`. Everything it knows and decides is in files of the worker
directory, which is how a restarted agent picks the worker up again:

    spec.json       (in)  command, job fields, GPU indices
    env.json        (in)  the job's env values (0600): read, then deleted before the command
                          starts, so the values stay only in the command's environment
    supervisor.pid  (out) this process
    log             (out) the command's stdout and stderr, appended
    output/         (out) ML_OUTPUT_PATH, also the command's working directory
    started.json    (out) {pid, started_at}
    exit.json       (out) {exit_code, ended_at, signal?, stopped?, error?}, written atomically

SIGTERM stops the worker: SIGTERM to the command's process group, SIGKILL after a grace
period, and exit.json records `stopped: true`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from .files import read_json, write_json_atomic, write_text_atomic
from .keyfiles import ENV_NAME, SECRETS_DIR

STOP_GRACE_S = 10.0
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
MOUNTS_DIR = "mnt"  # mount targets live under <worker_dir>/mnt/<target>


def _now() -> str:
    """Now, as ISO text: datetime directly, this process is started per job."""
    return datetime.now(UTC).isoformat()


def mount_dirs(spec: Mapping[str, Any], worker_dir: Path) -> dict[str, Path]:
    """Where each mount of the plan lives on this node, by its env variable (R-JOB-3/4).

    Without containers there are no bind mounts: each target (/opt/ml/input/...) is a
    directory under the worker's directory, and the worker finds it through the mount's
    variable (ML_DATA_PATH, ML_CHECKPOINT_PATH, ML_MODEL_PATH, ...). The output mount is
    the worker's output directory (ML_OUTPUT_PATH)."""
    out: dict[str, Path] = {}
    for m in spec.get("mounts") or []:
        target = str(m.get("target") or "")
        if m.get("kind") == "output" or not target.startswith("/"):
            continue
        rel = Path(*[p for p in target.split("/") if p and p not in (".", "..")])
        local = worker_dir / MOUNTS_DIR / rel
        if m.get("env"):
            out[str(m["env"])] = local
    return out


def share_env(spec: Mapping[str, Any]) -> dict[str, str]:
    """A fractional GPU (R-SCHED-4): the share and its memory limit, for the worker and for
    CUDA MPS (thread percentage; pinned memory limit of its one visible device)."""
    fraction = spec.get("gpu_fraction")
    if fraction in (None, ""):
        return {}
    env = {
        "GPU_FRACTION": str(fraction),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(float(fraction) * 100))),
    }
    limit = spec.get("gpu_memory_limit_mb")
    if limit:
        env["GPU_MEMORY_LIMIT_MB"] = str(int(limit))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={int(limit)}M"
    return env


def no_gpu_env(gpu_indices: Sequence[Any]) -> dict[str, str]:
    """A worker without GPUs (a CPU-only job, R-JOB-2) sees none: CUDA_VISIBLE_DEVICES is
    empty (CUDA: no device), and NVIDIA_VISIBLE_DEVICES=void, so an NVIDIA container
    toolkit hook, where the runtime has one, injects no GPU either."""
    return {} if gpu_indices else {"NVIDIA_VISIBLE_DEVICES": "void"}


def worker_env(
    spec: Mapping[str, Any], worker_dir: Path, base: Mapping[str, str]
) -> dict[str, str]:
    """The command's environment: the supervisor's own (less the agent's GPUFLEET_*
    settings, which may hold credentials), then the job's env, then gpufleet's variables."""
    env = {k: v for k, v in base.items() if not k.startswith("GPUFLEET_")}
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    env.update(
        JOB_NAME=str(spec.get("job_name") or ""),
        JOB_ID=str(spec["job_id"]),
        WORKER_NUMBER=str(spec["worker"]),
        ML_OUTPUT_PATH=str(worker_dir / "output"),
        CUDA_VISIBLE_DEVICES=",".join(str(int(i)) for i in spec.get("gpu_indices") or []),
        # CUDA's default order is "fastest first"; PCI order is the one NVML's indices use.
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
    )
    env.pop("NVIDIA_VISIBLE_DEVICES", None)  # a job never picks GPUs itself
    env.update(no_gpu_env(spec.get("gpu_indices") or []))
    env.update({k: str(v) for k, v in mount_dirs(spec, worker_dir).items()})
    env.update(share_env(spec))
    if spec.get("output_archive"):
        env["ML_OUTPUT_ARCHIVE"] = str(spec["output_archive"])
    if spec.get("key_types"):  # its attached keys' files (keyfiles.py)
        env[ENV_NAME] = str(worker_dir / SECRETS_DIR)
    return env


class _Stop(Exception):
    """Raised by the SIGTERM handler to interrupt the wait for the command."""


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Supervisor:
    def __init__(self, worker_dir: Path) -> None:
        self.dir = worker_dir
        self.stop_requested = False
        self._armed = False  # raise _Stop from the handler only while waiting
        self.child: subprocess.Popen[bytes] | None = None

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True
        if self._armed:
            self._armed = False
            raise _Stop

    def _take_env(self) -> dict[str, Any]:
        """The job's env values (env.json), removed from the disk once read."""
        path = self.dir / "env.json"
        values = read_json(path) or {}
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return values

    def _finish(self, **fields: Any) -> None:
        write_json_atomic(self.dir / "exit.json", {"ended_at": _now(), **fields})

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        write_text_atomic(self.dir / "supervisor.pid", f"{os.getpid()}\n")
        spec = read_json(self.dir / "spec.json")
        secrets = self._take_env()
        if spec is None or not spec.get("command"):
            self._finish(exit_code=None, error="spec.json is missing or has no command")
            return
        if self.stop_requested or (self.dir / "stop_requested").exists():
            self._finish(exit_code=None, stopped=True)
            return
        output = self.dir / "output"
        output.mkdir(exist_ok=True)
        for d in mount_dirs(spec, self.dir).values():
            d.mkdir(parents=True, exist_ok=True)
        command = [str(a) for a in spec["command"]]
        with (self.dir / "log").open("ab") as log:
            try:
                self.child = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=worker_env(
                        {**spec, "env": {**(spec.get("env") or {}), **secrets}},
                        self.dir,
                        os.environ,
                    ),
                    cwd=output,
                    start_new_session=True,  # its own process group, signalled as a whole
                )
            except OSError as exc:
                log.write(f"gpufleet: cannot start {command[0]!r}: {exc}\n".encode())
                code = 126 if isinstance(exc, PermissionError) else 127
                self._finish(exit_code=code, error=f"cannot start {command[0]!r}: {exc.strerror}")
                return
        write_json_atomic(
            self.dir / "started.json",
            {"pid": self.child.pid, "started_at": _now()},
        )
        returncode, stopped = self._wait(self.child, float(spec.get("stop_grace_s", STOP_GRACE_S)))
        # Whatever the command left running in its group would keep holding the GPUs.
        _killpg(self.child.pid, signal.SIGKILL)
        fields: dict[str, Any] = {"exit_code": returncode}
        if returncode < 0:  # killed by a signal: report it the way a shell does
            fields.update(
                exit_code=128 - returncode,
                signal=-returncode,
                signal_name=_signal_name(-returncode),
            )
        if stopped:
            fields["stopped"] = True
        self._finish(**fields)

    def _wait(self, child: subprocess.Popen[bytes], grace_s: float) -> tuple[int, bool]:
        try:
            self._armed = True
            if self.stop_requested:
                raise _Stop
            returncode = child.wait()
            self._armed = False
            return returncode, False
        except _Stop:
            self._armed = False
        _killpg(child.pid, signal.SIGTERM)
        try:
            return child.wait(timeout=grace_s), True
        except subprocess.TimeoutExpired:
            _killpg(child.pid, signal.SIGKILL)
            return child.wait(), True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpufleet_node_agent.supervise <worker_dir>", file=sys.stderr)
        return 2
    sup = Supervisor(Path(args[0]).absolute())
    try:
        sup.run()
    except BaseException as exc:  # never leave a worker unsupervised, nor without exit.json
        if sup.child is not None and sup.child.poll() is None:
            _killpg(sup.child.pid, signal.SIGKILL)
            sup.child.wait()
        if not (sup.dir / "exit.json").exists():
            sup._finish(exit_code=None, error=f"supervisor failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
