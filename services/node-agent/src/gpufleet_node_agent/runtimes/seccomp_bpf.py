"""A container's seccomp filter compiled once per node, as crun compiles it (issue 15).

crun turns the config's `linux.seccomp` into a BPF program with libseccomp for every
container: ~2 ms of its ~10 ms of CPU here. crun also takes a compiled program as is, from
the `run.oci.seccomp_bpf_data` annotation (base64), and then compiles nothing. So the agent
compiles the profile once, with the same library crun links (libseccomp.so.2) and the same
calls in the same order as crun's `libcrun_generate_seccomp`: the default action, the
architectures, then each rule (a rule whose action is the default's is left out; a name
libseccomp does not know is skipped, as crun skips it with a warning; several conditions
on one argument become one rule each). The result is byte for byte the program crun would
have made (tests/integration/node_agent/test_seccomp_bpf.py compares it with crun's own).
Anything this module does not know (an action, an operator, a missing library) raises
`Unavailable`: crun then compiles the profile itself, as before.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import os
from collections.abc import Mapping, Sequence
from typing import Any

ANNOTATION = "run.oci.seccomp_bpf_data"
LIBRARY = "libseccomp.so.2"
ACTIONS = {
    "ALLOW": 0x7FFF0000,
    "KILL": 0x00000000,
    "KILL_THREAD": 0x00000000,
    "KILL_PROCESS": 0x80000000,
    "TRAP": 0x00030000,
    "LOG": 0x7FFC0000,
}
ERRNO, TRACE = 0x00050000, 0x7FF00000  # | the errno value (16 bits)
OPERATORS = {"NE": 1, "LT": 2, "LE": 3, "EQ": 4, "GE": 5, "GT": 6, "MASKED_EQ": 7}
UNKNOWN_SYSCALL = -1  # libseccomp's __NR_SCMP_ERROR


class Unavailable(Exception):
    """Not compiled here: crun compiles the profile itself."""


class _Cmp(ctypes.Structure):  # struct scmp_arg_cmp
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError as exc:
        raise Unavailable(f"{LIBRARY}: {exc}") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_Cmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def action(name: str, errno_ret: int) -> int:
    short = name.removeprefix("SCMP_ACT_")
    if short == "ERRNO":
        return ERRNO | (errno_ret & 0xFFFF)
    if short == "TRACE":
        return TRACE | (errno_ret & 0xFFFF)
    if short not in ACTIONS or not name.startswith("SCMP_ACT_"):
        raise Unavailable(f"seccomp action {name!r}")
    return ACTIONS[short]


def conditions(args: Sequence[Mapping[str, Any]]) -> list[list[_Cmp]]:
    """The rules one syscall entry's conditions make: all of them in one rule, or one rule
    each where an argument is compared twice (libseccomp cannot AND those)."""
    cmps = []
    for a in args[:6]:
        op = str(a.get("op", ""))
        if not op.startswith("SCMP_CMP_") or op.removeprefix("SCMP_CMP_") not in OPERATORS:
            raise Unavailable(f"seccomp operator {op!r}")
        index = int(a["index"])
        if not 0 <= index < 6:
            raise Unavailable(f"seccomp argument index {index}")
        cmps.append(
            _Cmp(
                index,
                OPERATORS[op.removeprefix("SCMP_CMP_")],
                a.get("value", 0),
                a.get("valueTwo", 0),
            )
        )
    indexes = [c.arg for c in cmps]
    if len(set(indexes)) == len(indexes):
        return [cmps]
    return [[c] for c in cmps]


def compile_profile(profile: Mapping[str, Any]) -> bytes:
    """The BPF program crun would make of `profile` (an OCI `linux.seccomp`)."""
    lib = _library()
    default = action(
        str(profile["defaultAction"]), int(profile.get("defaultErrnoRet", errno.EPERM))
    )
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise Unavailable("seccomp_init failed")
    try:
        for arch in profile.get("architectures") or []:
            name = str(arch).removeprefix("SCMP_ARCH_").lower()
            token = lib.seccomp_arch_resolve_name(name.encode())
            if token == 0:
                raise Unavailable(f"seccomp architecture {arch!r}")
            rc = lib.seccomp_arch_add(ctx, token)
            if rc < 0 and rc != -errno.EEXIST:
                raise Unavailable(f"seccomp_arch_add {arch}: {os.strerror(-rc)}")
        for rule in profile.get("syscalls") or []:
            act = action(str(rule["action"]), int(rule.get("errnoRet", errno.EPERM)))
            if act == default:
                continue
            for name in rule.get("names") or []:
                nr = lib.seccomp_syscall_resolve_name(str(name).encode())
                if nr == UNKNOWN_SYSCALL:
                    continue  # as crun: unknown here, ignored
                args = rule.get("args")
                for group in conditions(args) if args is not None else [[]]:
                    array = (_Cmp * len(group))(*group) if group else None
                    rc = lib.seccomp_rule_add_array(ctx, act, nr, len(group), array)
                    if rc < 0:
                        raise Unavailable(f"seccomp_rule_add {name}: {os.strerror(-rc)}")
        fd = os.memfd_create("gpufleet-seccomp", os.MFD_CLOEXEC)
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc < 0:
                raise Unavailable(f"seccomp_export_bpf: {os.strerror(-rc)}")
            size = os.fstat(fd).st_size
            program = os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if not program or len(program) % 8:
        raise Unavailable(f"a BPF program of {len(program)} bytes")
    return program


def annotation(profile: Mapping[str, Any]) -> str:
    """The annotation's value: the compiled program, base64."""
    return base64.b64encode(compile_profile(profile)).decode()
