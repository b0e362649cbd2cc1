"""The argv that runs a configuration's start command (pure): in a container through podman,
with the Jetson's GPU (CDI `nvidia.com/gpu=all`) and its video devices, the output directory
mounted at the configuration's output path, its checkpoints read-only at /opt/ml/checkpoint
and its attached keys' files read-only at /run/secrets; or, simulated, as a host process."""

from __future__ import annotations

from pathlib import Path

from gpufleet_contracts.devices import DeviceConfigSpec

from ..steps.keys import CONTAINER_PATH
from .checkpoints import CHECKPOINT, StagedCheckpoints
from .keys import DeviceSecrets


def container_name(minion_id: str) -> str:
    return f"gpufleet-device-{minion_id}"


def podman_argv(
    spec: DeviceConfigSpec,
    minion_id: str,
    output_dir: Path,
    video: list[str],
    device_model: str,
    secrets: DeviceSecrets | None = None,
    checkpoints: StagedCheckpoints | None = None,
) -> list[str]:
    secrets = secrets or DeviceSecrets()
    checkpoints = checkpoints or StagedCheckpoints()
    argv = ["podman", "run", "--rm", "--replace", "--name", container_name(minion_id)]
    argv += ["--device", "nvidia.com/gpu=all", *(a for v in video for a in ("--device", v))]
    argv += ["--volume", f"{output_dir}:{spec.output_path}:rw"]
    if secrets.files is not None:
        argv += ["--volume", f"{secrets.files}:{CONTAINER_PATH}:ro"]
    if checkpoints.dir is not None:
        argv += ["--volume", f"{checkpoints.dir}:{CHECKPOINT}:ro"]
    own = {**secrets.env(container=True), **checkpoints.env(container=True)}
    for key, value in sorted({**spec.env, **own}.items()):
        argv += ["--env", f"{key}={value}"]
    argv += [
        "--env",
        f"GPUFLEET_MODEL={spec.model}",
        "--env",
        f"GPUFLEET_DEVICE_MODEL={device_model}",
    ]
    return [*argv, spec.image, "sh", "-c", spec.start_command]


def simulated_argv(spec: DeviceConfigSpec) -> list[str]:
    return ["sh", "-c", spec.start_command]


def simulated_env(
    spec: DeviceConfigSpec,
    output_dir: Path,
    base: dict[str, str],
    device_model: str,
    secrets: DeviceSecrets | None = None,
    checkpoints: StagedCheckpoints | None = None,
) -> dict[str, str]:
    """A simulated run's environment: the configuration's, its model, the Jetson model the
    profile plays, its output path (the directory standing for the mount), where its
    attached keys' files are (`SECRETS_PATH`) and its checkpoints (`ML_CHECKPOINT_PATH`)."""
    return {
        **base,
        **spec.env,
        **(secrets or DeviceSecrets()).env(container=False),
        **(checkpoints or StagedCheckpoints()).env(container=False),
        "GPUFLEET_MODEL": spec.model,
        "GPUFLEET_DEVICE_MODEL": device_model,
        "GPUFLEET_OUTPUT": str(output_dir),
    }
