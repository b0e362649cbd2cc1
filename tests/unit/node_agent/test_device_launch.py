"""The device agent's pure parts: when a starting agent runs the command again (R-DEV-3), and
the argv that runs a configuration through podman with the Jetson's devices, or simulated."""

from __future__ import annotations

from pathlib import Path

from gpufleet_contracts.devices import DeviceConfigSpec, InferenceStatus
from gpufleet_node_agent.device import launch
from gpufleet_node_agent.device.keeper import Desired, inference_of, runs_again

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
