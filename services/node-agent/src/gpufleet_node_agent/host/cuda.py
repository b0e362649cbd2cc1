"""What the GPU check proves of one GPU, through the CUDA driver API (`libcuda.so.1`, the
NVIDIA driver's own library: no CUDA toolkit, no new dependency), by ctypes.

`prove` finds the device by its PCI bus id and makes sure it is the GPU NVML named (its
UUID), creates a context, allocates as much of its memory as it can (1 GiB pieces, smaller
ones at the end), writes a byte pattern over all of it and reads samples of it back, times
device-to-device copies with CUDA events (the best of a few, after a warm-up: clocks ramp
up from idle), then frees everything and destroys the context. Every CUresult is checked;
the first failure raises `CudaError` naming the call. The caller runs it in a process of
its own under a timeout (gpucheck.py).
"""

from __future__ import annotations

import ctypes
import uuid
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
GIB = 1024 * MIB
CHUNK = GIB  # allocation piece
MIN_CHUNK = 16 * MIB  # below this, the memory left is the driver's
SLACK = 64 * MIB  # left free below what the driver says is free (its own bookkeeping)
SAMPLE = 4096  # bytes read back at each sampled place
COPY_BYTES = GIB  # what each timed copy moves (at most)
COPY_RUNS = 5
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY
LIBRARY = "libcuda.so.1"

CUdeviceptr = ctypes.c_uint64


class CudaUnavailable(Exception):
    """No CUDA driver library on this machine."""


class CudaError(Exception):
    """A CUDA driver call failed."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.call = call
        self.code = code


# (name, argtypes): the calls used, with their C argument types, set on the real library.
_P = ctypes.c_void_p
PROTOTYPES: dict[str, list[Any]] = {
    "cuInit": [ctypes.c_uint],
    "cuDeviceGetByPCIBusId": [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p],
    "cuDeviceGetUuid": [ctypes.c_char_p, ctypes.c_int],
    "cuCtxCreate_v2": [ctypes.POINTER(_P), ctypes.c_uint, ctypes.c_int],
    "cuCtxDestroy_v2": [_P],
    "cuCtxSynchronize": [],
    "cuMemGetInfo_v2": [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
    "cuMemAlloc_v2": [ctypes.POINTER(CUdeviceptr), ctypes.c_size_t],
    "cuMemFree_v2": [CUdeviceptr],
    "cuMemsetD8_v2": [CUdeviceptr, ctypes.c_ubyte, ctypes.c_size_t],
    "cuMemcpyDtoD_v2": [CUdeviceptr, CUdeviceptr, ctypes.c_size_t],
    "cuMemcpyDtoH_v2": [_P, CUdeviceptr, ctypes.c_size_t],
    "cuEventCreate": [ctypes.POINTER(_P), ctypes.c_uint],
    "cuEventRecord": [_P, _P],
    "cuEventSynchronize": [_P],
    "cuEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _P, _P],
    "cuEventDestroy_v2": [_P],
    "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
}


class Driver:
    """The driver library (or a stand-in with the same functions), every call checked."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    @classmethod
    def load(cls, name: str = LIBRARY) -> Driver:
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise CudaUnavailable(f"no CUDA driver library ({exc})") from exc
        for fn, argtypes in PROTOTYPES.items():
            f = getattr(lib, fn)
            f.argtypes = argtypes
            f.restype = ctypes.c_int
        return cls(lib)

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        try:
            if self.lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
                return text.value.decode()
        except Exception:  # the error's name is a courtesy; the code is the fact
            pass
        return "CUDA error"

    def call(self, fn: str, *args: Any) -> None:
        code = int(getattr(self.lib, fn)(*args))
        if code != 0:
            raise CudaError(fn, code, self.error_name(code))

    def init(self) -> None:
        self.call("cuInit", 0)


@dataclass(frozen=True)
class Proved:
    allocated: int  # bytes allocated, written and sampled back
    bandwidth_gbps: float  # device-to-device copy: bytes read + written per second / 1e9


def cuda_bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as CUDA takes it, `0000:3b:00.0`."""
    domain, rest = nvml_bus_id.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def uuid_text(raw: bytes) -> str:
    """A CUDA device UUID (16 bytes) as NVML writes it: `GPU-xxxxxxxx-xxxx-...`."""
    return f"GPU-{uuid.UUID(bytes=bytes(raw[:16]))}"


def _allocate(cu: Driver, budget: int) -> list[tuple[int, int]]:
    """As much device memory as it gives, up to `budget` bytes: (pointer, size) pieces."""
    pieces: list[tuple[int, int]] = []
    left, size = budget, CHUNK
    while left >= MIN_CHUNK and size >= MIN_CHUNK:
        want = min(size, left)
        ptr = CUdeviceptr()
        try:
            cu.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(want))
        except CudaError as exc:
            if exc.code != OUT_OF_MEMORY:
                raise
            size //= 2  # what is left is in smaller free ranges, or is the driver's
            continue
        pieces.append((int(ptr.value), want))
        left -= want
    return pieces


def _sample(cu: Driver, pieces: list[tuple[int, int]], pattern: int) -> None:
    """Read back the start, middle and end of every piece: each byte must be `pattern`."""
    buf = ctypes.create_string_buffer(SAMPLE)
    for ptr, size in pieces:
        for offset in {0, (size // 2) & ~(SAMPLE - 1), size - SAMPLE}:
            cu.call(
                "cuMemcpyDtoH_v2",
                ctypes.cast(buf, ctypes.c_void_p),
                CUdeviceptr(ptr + offset),
                ctypes.c_size_t(SAMPLE),
            )
            if buf.raw != bytes([pattern]) * SAMPLE:
                raise CudaError(
                    "readback", -1, f"memory at +{ptr + offset:#x} lost what was written"
                )


def _copy_rate(cu: Driver, pieces: list[tuple[int, int]]) -> float:
    """The best of COPY_RUNS timed copies between two pieces (or two halves of one)."""
    big = sorted(pieces, key=lambda p: -p[1])
    if len(big) >= 2:
        (src, a), (dst, b) = big[0], big[1]
        n = min(a, b, COPY_BYTES)
    else:
        src, size = big[0]
        n = min(size // 2, COPY_BYTES)
        dst = src + n
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    cu.call("cuEventCreate", ctypes.byref(start), 0)
    try:
        cu.call("cuEventCreate", ctypes.byref(end), 0)
        try:
            best = float("inf")
            cu.call("cuMemcpyDtoD_v2", CUdeviceptr(dst), CUdeviceptr(src), ctypes.c_size_t(n))
            for _ in range(COPY_RUNS):
                cu.call("cuEventRecord", start, None)
                cu.call("cuMemcpyDtoD_v2", CUdeviceptr(dst), CUdeviceptr(src), ctypes.c_size_t(n))
                cu.call("cuEventRecord", end, None)
                cu.call("cuEventSynchronize", end)
                ms = ctypes.c_float()
                cu.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
                if ms.value > 0:
                    best = min(best, ms.value)
        finally:
            cu.call("cuEventDestroy_v2", end)
    finally:
        cu.call("cuEventDestroy_v2", start)
    return 0.0 if best == float("inf") else 2 * n / (best / 1000) / 1e9


def prove(cu: Driver, nvml_bus_id: str, nvml_uuid: str, pattern: int) -> Proved:
    """Allocate, write, read back and time the memory of the GPU at `nvml_bus_id`, which
    must be the one NVML calls `nvml_uuid`. `cu` is initialised (`Driver.init`)."""
    dev = ctypes.c_int()
    cu.call("cuDeviceGetByPCIBusId", ctypes.byref(dev), cuda_bus_id(nvml_bus_id).encode())
    raw = ctypes.create_string_buffer(16)
    cu.call("cuDeviceGetUuid", raw, dev)
    found = uuid_text(raw.raw)
    if found.lower() != nvml_uuid.lower():
        raise CudaError("cuDeviceGetUuid", -1, f"CUDA's device there is {found}, not {nvml_uuid}")
    ctx = ctypes.c_void_p()
    cu.call("cuCtxCreate_v2", ctypes.byref(ctx), 0, dev)
    pieces: list[tuple[int, int]] = []
    proved: Proved | None = None
    try:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cu.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        pieces = _allocate(cu, max(0, int(free.value) - SLACK))
        if not pieces:
            raise CudaError("cuMemAlloc_v2", OUT_OF_MEMORY, "no device memory could be allocated")
        for ptr, size in pieces:
            cu.call(
                "cuMemsetD8_v2", CUdeviceptr(ptr), ctypes.c_ubyte(pattern), ctypes.c_size_t(size)
            )
        cu.call("cuCtxSynchronize")
        _sample(cu, pieces, pattern)
        rate = _copy_rate(cu, pieces)
        proved = Proved(allocated=sum(size for _, size in pieces), bandwidth_gbps=rate)
    finally:
        _release(cu, ctx, pieces, strict=proved is not None)
    return proved


def _release(cu: Driver, ctx: ctypes.c_void_p, pieces: list[tuple[int, int]], strict: bool) -> None:
    """Free the pieces and destroy the context (which frees whatever is left). `strict`: a
    failure raises (after a failure already on its way, it would only hide that one)."""
    errors: list[CudaError] = []
    for ptr, _ in pieces:
        try:
            cu.call("cuMemFree_v2", CUdeviceptr(ptr))
        except CudaError as exc:
            errors.append(exc)
    try:
        cu.call("cuCtxDestroy_v2", ctx)
    except CudaError as exc:
        errors.append(exc)
    if strict and errors:
        raise errors[0]
