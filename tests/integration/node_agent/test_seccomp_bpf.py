"""The seccomp filter the agent compiles once per node (seccomp_bpf.py) is byte for byte the
program crun compiles from the same profile: `crun create` writes its own to the
container's state directory (seccomp.bpf), read here before the container is deleted. That
crun enforces the precompiled one is test_podman_runtime.py's 32-bit system call test (crun
containers carry the annotation). Skipped where crun, root or the profile is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from gpufleet_node_agent.runtimes import cgroupv1, oci, runc, seccomp_bpf
from gpufleet_node_agent.runtimes.podman_args import ContainerSpec

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("crun") is None
    or not runc.SECCOMP_JSON.exists()
    or not runc.CATATONIT.exists(),
    reason="needs root, crun, catatonit and containers' seccomp.json",
)


def profile() -> dict[str, object]:
    return oci.seccomp(json.loads(runc.SECCOMP_JSON.read_text()))


def crun_compiled(tmp_path: Path, seccomp: dict[str, object]) -> bytes:
    """What crun itself compiles for a container with `seccomp`."""
    spec = ContainerSpec(
        name="probe",
        image="none",
        command=["true"],
        labels={},
        env={},
        binds=[],
        devices=[],
        log_path=tmp_path / "log",
        user="10000:10000",
        network="none",
        memory_mb=256,
        cpus=1.0,
        pids=64,
        read_only=True,
    )
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    config = oci.oci_config(spec, rootfs, init=runc.CATATONIT, seccomp_profile=seccomp)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(config))
    state = tmp_path / "state"
    crun = ["crun", "--cgroup-manager=disabled", "--root", str(state)]
    found, _ = cgroupv1.Cgroups.here()
    hide = cgroupv1.hide_unified() if found is not None and found.hybrid else []
    name = f"seccomp-probe-{os.getpid()}"
    with (tmp_path / "crun.err").open("wb") as err:  # no pipe: the container holds its stdio
        subprocess.run(
            [*hide, *crun, "create", "--bundle", str(bundle), name],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=60,
        )
    try:
        return (state / name / "seccomp.bpf").read_bytes()
    finally:
        subprocess.run(
            [*crun, "delete", "--force", name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=60,
        )


def test_the_filter_compiled_once_is_the_one_crun_compiles(tmp_path: Path) -> None:
    seccomp = profile()
    ours = seccomp_bpf.compile_profile(seccomp)
    assert ours == crun_compiled(tmp_path, seccomp)
    assert len(ours) > 1000 and len(ours) % 8 == 0  # a real program, whole instructions


def test_a_profile_with_two_conditions_on_one_argument_matches_crun_too(
    tmp_path: Path,
) -> None:
    """crun makes one rule per condition then (libseccomp cannot AND them): the same here."""
    seccomp = profile()
    seccomp["syscalls"] = [
        *seccomp["syscalls"],  # type: ignore[list-item]
        {  # a call the profile does not name (the default action answers it)
            "names": ["add_key"],
            "action": "SCMP_ACT_ALLOW",
            "args": [
                {"index": 0, "value": 0, "op": "SCMP_CMP_EQ"},
                {"index": 0, "value": 1, "op": "SCMP_CMP_EQ"},
                {"index": 1, "value": 7, "valueTwo": 3, "op": "SCMP_CMP_MASKED_EQ"},
            ],
        },
    ]
    ours = seccomp_bpf.compile_profile(seccomp)
    assert ours == crun_compiled(tmp_path, seccomp)
    assert ours != seccomp_bpf.compile_profile(profile())  # the rules are in it


def test_what_it_does_not_know_is_left_to_crun() -> None:
    seccomp = profile()
    seccomp["defaultAction"] = "SCMP_ACT_SOMETHING_NEW"
    with pytest.raises(seccomp_bpf.Unavailable, match="SCMP_ACT_SOMETHING_NEW"):
        seccomp_bpf.compile_profile(seccomp)
