"""Node agent: a worker's container as runc's config.json (oci.py), as plain data: the same
container `podman run` would make (test_podman_args.py), and podman's seccomp profile."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from gpufleet_node_agent.host import mps
from gpufleet_node_agent.runtimes.oci import Device, device_nodes, oci_config, seccomp
from gpufleet_node_agent.runtimes.podman_args import container_spec
from gpufleet_node_agent.runtimes.runc import Runc

from .test_podman_args import CONFIG, WD, spec

ROOT = Path("/var/lib/containers/storage/overlay/abc/merged")
INIT = Path("/usr/libexec/podman/catatonit")
GPU = Device("/dev/nvidia5", 195, 5)


def config(**kw: Any) -> dict[str, Any]:
    c = container_spec(
        spec(), WD, "m1", CONFIG, job_env={"API_TOKEN": "s3cret", "PATH": "/opt/bin"}
    )
    return oci_config(c, ROOT, init=INIT, **kw)


def test_the_process_has_no_privilege_and_runs_the_command_under_catatonit() -> None:
    cfg = config(entrypoint=["/entry.sh"], image_env={"PATH": "/usr/bin", "LANG": "C.UTF-8"})
    p = cfg["process"]
    assert p["user"] == {"uid": 10000, "gid": 10000}
    assert p["noNewPrivileges"] is True
    assert all(v == [] for v in p["capabilities"].values()) and len(p["capabilities"]) == 5
    # catatonit is PID 1; the image's entrypoint comes before the command, as `podman run`
    assert p["args"] == [
        "/run/gpufleet-init", "--", "/entry.sh", "python3", "train.py", "--epochs", "3"
    ]  # fmt: skip
    env = dict(e.split("=", 1) for e in p["env"])
    # the image's env under the job's, gpufleet's over both
    assert (env["PATH"], env["LANG"], env["API_TOKEN"]) == ("/opt/bin", "C.UTF-8", "s3cret")
    assert env["JOB_ID"] == "job-1" and env["HOME"] == "/tmp"
    assert p["cwd"] == "/opt/ml/output" and p["terminal"] is False
    assert cfg["root"] == {"path": str(ROOT), "readonly": True}


def test_namespaces_limits_and_only_its_own_devices() -> None:
    cfg = config(devices=[GPU])
    linux = cfg["linux"]
    assert [n["type"] for n in linux["namespaces"]] == ["pid", "network", "ipc", "uts", "mount"]
    assert all("path" not in n for n in linux["namespaces"])  # new ones, none shared
    r = linux["resources"]
    assert r["memory"] == {"limit": 2048 * 2**20, "swap": 2048 * 2**20}
    assert r["cpu"] == {"quota": 150_000, "period": 100_000}
    assert r["pids"] == {"limit": 512}
    assert r["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 5, "access": "rwm"},
    ]
    assert linux["devices"] == [
        {"path": "/dev/nvidia5", "type": "c", "major": 195, "minor": 5, "fileMode": 0o666}
    ]
    assert linux["cgroupsPath"].startswith("/gpufleet/gpufleet-job-1-0-")
    assert "/proc/kcore" in linux["maskedPaths"] and "/proc/sys" in linux["readonlyPaths"]
    assert cfg["annotations"]["gpufleet.minion"] == "m1"


def test_mounts_a_bind_under_another_after_it_and_the_binds_nosuid_nodev() -> None:
    c = container_spec(spec(), WD, "m1", CONFIG, mps_pipe=Path("/run/mps/pl-1"))
    cfg = oci_config(c, ROOT, init=INIT)
    targets = [m["destination"] for m in cfg["mounts"]]
    assert targets.index("/tmp") < targets.index(mps.MPS_TARGET)
    assert targets.index("/run") < targets.index("/run/gpufleet-init")
    assert targets.count("/tmp") == 1  # the quota's, not a tmpfs as well
    sysfs = next(m for m in cfg["mounts"] if m["destination"] == "/sys")
    assert "ro" in sysfs["options"]
    for m in cfg["mounts"]:
        if m["type"] == "bind":
            assert {"nosuid", "nodev"} <= set(m["options"]), m
    ro = {m["destination"] for m in cfg["mounts"] if "ro" in m.get("options", [])}
    assert {"/opt/ml/input", "/opt/ml/models", "/run/gpufleet-init"} <= ro
    assert "/opt/ml/output" not in ro


PROFILE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 38,
    "archMap": [
        {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]},
        {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
    ],
    "syscalls": [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW", "args": [], "includes": {}},
        {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
        {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["amd64"]}},
        {
            "names": ["vhangup"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
            "excludes": {"caps": ["CAP_SYS_TTY_CONFIG"]},
        },
        {
            "names": ["personality"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": 0, "valueTwo": 0, "op": "SCMP_CMP_EQ"}],
        },
    ],
}


def test_podmans_seccomp_profile_for_a_process_without_capabilities() -> None:
    out = seccomp(PROFILE, "x86_64")
    assert out["defaultAction"] == "SCMP_ACT_ERRNO" and out["defaultErrnoRet"] == 38
    assert out["architectures"] == ["SCMP_ARCH_X86_64"]  # its own only: no 32-bit calls
    names = [r["names"] for r in out["syscalls"]]
    # `mount` needs CAP_SYS_ADMIN: left out; vhangup's refusal (for lack of a cap) kept
    assert names == [["read", "write"], ["arch_prctl"], ["vhangup"], ["personality"]]
    assert out["syscalls"][2]["errnoRet"] == 1
    eq0 = {"index": 0, "value": 0, "valueTwo": 0, "op": "SCMP_CMP_EQ"}
    assert out["syscalls"][3]["args"] == [eq0]
    arm = seccomp(PROFILE, "aarch64")
    assert arm["architectures"] == ["SCMP_ARCH_AARCH64"]
    assert ["arch_prctl"] not in [r["names"] for r in arm["syscalls"]]


def test_the_installed_profile_converts_and_denies_what_podman_denies() -> None:
    path = Path("/usr/share/containers/seccomp.json")
    if not path.exists():
        pytest.skip("containers' seccomp profile is not installed")
    out = seccomp(json.loads(path.read_text()))
    allowed = {n for r in out["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    assert {"read", "execve", "clone"} <= allowed
    # podman's profile leaves mount, unshare, ... to the capabilities a worker has none of
    denied = {"kexec_load", "init_module", "delete_module", "bpf", "open_by_handle_at", "swapon"}
    assert not denied & allowed


def test_device_nodes_are_read_from_the_host_and_cdi_names_are_not_runcs() -> None:
    null = device_nodes(["/dev/null"])
    assert null is not None and (null[0].major, null[0].minor) == (1, 3)
    assert device_nodes(["nvidia.com/gpu=GPU-aa"]) is None
    assert device_nodes(["/etc/passwd"]) is None  # not a character device


def test_what_runc_does_not_start() -> None:
    quota = container_spec(spec(), WD, "m1", CONFIG)
    assert Runc.unsuited(quota) is None
    assert "writable root" in (Runc.unsuited(replace(quota, read_only=False)) or "")
    assert "network" in (Runc.unsuited(replace(quota, network="slirp4netns")) or "")
    assert "CDI" in (Runc.unsuited(replace(quota, devices=["nvidia.com/gpu=GPU-aa"])) or "")
