"""The device agent's pure parts: when a starting agent runs the command again (R-DEV-3), and
the argv that runs a configuration through podman with the Jetson's devices (and its attached
keys' files), or simulated; a sealed box of keys opens with its request's key alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_auth.sealing import SealingKey, key_id, seal
from gpufleet_contracts.devices import DeviceConfigSpec, DeviceKeys, InferenceStatus
from gpufleet_contracts.jobs import SealedSecrets, SecretFields
from gpufleet_node_agent.device import launch
from gpufleet_node_agent.device.checkpoints import CheckpointsUnavailable, StagedCheckpoints, subdir
from gpufleet_node_agent.device.keeper import Desired, inference_of, runs_again
from gpufleet_node_agent.device.keys import DeviceSecrets, KeysUnavailable, opened

SPEC = DeviceConfigSpec(
    image="nvcr.io/nvidia/l4t-ml:r36",
    model="yolov8n",
    start_command="python3 serve.py --fps $FPS",
    env={"FPS": "30"},
)


def test_it_runs_again_after_a_reboot_or_a_crash_never_after_exiting_by_itself() -> None:
    assert not runs_again(Desired(), "b1")  # nothing to run
    assert runs_again(Desired("r1", "c", SPEC), "b1")  # the agent went down while it ran
    exited = Desired("r1", "c", SPEC, exit_code=0, exit_boot="b1")
    assert not runs_again(exited, "b1")  # exited by itself in this boot
    assert runs_again(exited, "b2")  # the device rebooted since


def test_an_exit_status_says_stopped_or_failed() -> None:
    assert inference_of(0) == InferenceStatus.stopped
    assert inference_of(137) == InferenceStatus.failed


def test_podman_runs_the_image_with_the_soc_devices_and_the_output_mounted() -> None:
    argv = launch.podman_argv(
        SPEC, "m1", Path("/var/lib/d/output"), ["/dev/video0"], "jetson-agx-orin"
    )
    assert argv[:6] == ["podman", "run", "--rm", "--replace", "--name", "gpufleet-device-m1"]
    assert argv[6:8] == ["--device", "nvidia.com/gpu=all"]
    assert argv[8:10] == ["--device", "/dev/video0"]
    assert "/var/lib/d/output:/opt/ml/output:rw" in argv
    assert "FPS=30" in argv and "GPUFLEET_MODEL=yolov8n" in argv
    assert "GPUFLEET_DEVICE_MODEL=jetson-agx-orin" in argv
    assert argv[-4:] == [SPEC.image, "sh", "-c", SPEC.start_command]


def test_a_simulated_device_runs_the_command_as_a_process() -> None:
    assert launch.simulated_argv(SPEC) == ["sh", "-c", SPEC.start_command]
    env = launch.simulated_env(SPEC, Path("/o"), {"PATH": "/bin"}, "jetson-orin-nano")
    assert env == {
        "PATH": "/bin",
        "FPS": "30",
        "GPUFLEET_MODEL": "yolov8n",
        "GPUFLEET_DEVICE_MODEL": "jetson-orin-nano",
        "GPUFLEET_OUTPUT": "/o",
    }


def test_the_attached_keys_files_are_mounted_read_only_and_named_by_secrets_path() -> None:
    keyed = DeviceSecrets(Path("/var/lib/d/secrets"))
    argv = launch.podman_argv(SPEC, "m1", Path("/o"), [], "jetson-agx-orin", keyed)
    assert "/var/lib/d/secrets:/run/secrets:ro" in argv and "SECRETS_PATH=/run/secrets" in argv
    env = launch.simulated_env(SPEC, Path("/o"), {}, "jetson-orin-nano", keyed)
    assert env["SECRETS_PATH"] == "/var/lib/d/secrets"
    assert "SECRETS_PATH" not in launch.simulated_env(SPEC, Path("/o"), {}, "jetson-orin-nano")
    assert not any("/run/secrets" in a for a in launch.podman_argv(SPEC, "m1", Path("/o"), [], "x"))


def test_one_checkpoint_is_mounted_read_only_at_opt_ml_checkpoint() -> None:
    one = StagedCheckpoints(Path("/var/lib/d/checkpoints"), {"yolo weights": ""})
    argv = launch.podman_argv(SPEC, "m1", Path("/o"), [], "x", None, one)
    assert "/var/lib/d/checkpoints:/opt/ml/checkpoint:ro" in argv
    assert "ML_CHECKPOINT_PATH=/opt/ml/checkpoint" in argv
    assert not any(a.startswith("ML_CHECKPOINT_PATH_") for a in argv)
    env = launch.simulated_env(SPEC, Path("/o"), {}, "x", None, one)
    assert env["ML_CHECKPOINT_PATH"] == "/var/lib/d/checkpoints"
    assert not any("checkpoint" in a for a in launch.podman_argv(SPEC, "m1", Path("/o"), [], "x"))


def test_several_checkpoints_each_at_its_name_as_a_job_s_are() -> None:
    several = StagedCheckpoints(
        Path("/c"), {"yolo weights": "yolo_weights", "acme/lut": "acme/lut"}
    )
    argv = launch.podman_argv(SPEC, "m1", Path("/o"), [], "x", None, several)
    assert "ML_CHECKPOINT_PATH=/opt/ml/checkpoint" in argv
    assert "ML_CHECKPOINT_PATH_YOLO_WEIGHTS=/opt/ml/checkpoint/yolo_weights" in argv
    assert "ML_CHECKPOINT_PATH_ACME_LUT=/opt/ml/checkpoint/acme/lut" in argv
    env = launch.simulated_env(SPEC, Path("/o"), {}, "x", None, several)
    assert env["ML_CHECKPOINT_PATH_YOLO_WEIGHTS"] == "/c/yolo_weights"


@pytest.mark.parametrize("name", ["..", "a/../b", "/abs", "a//b", "./a"])
def test_a_checkpoint_name_never_leaves_the_checkpoints_directory(name: str) -> None:
    with pytest.raises(CheckpointsUnavailable):
        subdir(name)


def test_a_box_opens_with_the_request_s_key_alone() -> None:
    key = SealingKey.generate()
    fields = SecretFields(attached_keys={"huggingface": {"token": "hf-value"}})
    box = seal(key.public_key, fields.model_dump_json().encode())
    reply = DeviceKeys(
        types=["huggingface"], sealed=SealedSecrets(key_id=key_id(key.public_key), box=box)
    )
    assert opened(reply, key).attached_keys == {"huggingface": {"token": "hf-value"}}
    with pytest.raises(KeysUnavailable) as refused:
        opened(reply, SealingKey.generate())
    assert "hf-value" not in refused.value.reason
