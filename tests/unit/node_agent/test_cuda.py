"""The GPU check's CUDA part (cuda.py) against a stand-in for libcuda.so.1 that keeps the
books of one machine's GPUs: every call is made as ctypes makes it (pointers written
through, sizes as size_t), so the allocation, the readback, the timing and the clean-up
are exercised here; the real library on a real GPU is tests/integration/node_agent/
test_gpucheck_gpu.py's (skipped without one)."""

from __future__ import annotations

import ctypes
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from gpufleet_node_agent.host.cuda import (
    CHUNK,
    GIB,
    MIB,
    SLACK,
    CudaError,
    Driver,
    cuda_bus_id,
    prove,
    uuid_text,
)

INVALID_DEVICE = 101


@dataclass
class FakeGpu:
    bus_id: str  # as CUDA takes it
    uuid: str
    free: int  # bytes the driver says are free
    rate_gbps: float = 900.0  # what a copy measures
    fail: str | None = None  # a call that fails on this GPU
    forgets: bool = False  # its memory does not hold what is written (a broken card)


@dataclass
class FakeCuda:
    """The calls of libcuda.so.1 that cuda.py makes, on these GPUs."""

    gpus: list[FakeGpu]
    calls: list[str] = field(default_factory=list)
    pieces: dict[int, list[int]] = field(default_factory=dict)  # ptr -> [size, byte]
    contexts: int = 0  # live contexts
    events: int = 0  # live events
    gpu: FakeGpu | None = None
    copied: int = 0  # bytes of the last copy
    _next: int = 0x7F0000000000

    def _ok(self, name: str) -> int:
        self.calls.append(name)
        return 2 if self.gpu is not None and self.gpu.fail == name else 0

    def cuInit(self, flags: int) -> int:
        return self._ok("cuInit")

    def cuGetErrorName(self, code: int, out: Any) -> int:
        out._obj.value = b"CUDA_ERROR_OUT_OF_MEMORY" if code == 2 else b"CUDA_ERROR_INVALID_DEVICE"
        return 0

    def cuDeviceGetByPCIBusId(self, dev: Any, bus: bytes) -> int:
        for i, g in enumerate(self.gpus):
            if g.bus_id == bus.decode():
                dev._obj.value = i
                return self._ok("cuDeviceGetByPCIBusId")
        return INVALID_DEVICE

    def cuDeviceGetUuid(self, raw: Any, dev: Any) -> int:
        ctypes.memmove(raw, uuid.UUID(self.gpus[dev.value].uuid.removeprefix("GPU-")).bytes, 16)
        return self._ok("cuDeviceGetUuid")

    def cuCtxCreate_v2(self, ctx: Any, flags: int, dev: Any) -> int:
        self.gpu = self.gpus[dev.value]
        ctx._obj.value = 0x1000
        self.contexts += 1
        return self._ok("cuCtxCreate_v2")

    def cuCtxDestroy_v2(self, ctx: Any) -> int:
        self.contexts -= 1
        self.pieces.clear()  # a context's memory goes with it
        return self._ok("cuCtxDestroy_v2")

    def cuCtxSynchronize(self) -> int:
        return self._ok("cuCtxSynchronize")

    def cuMemGetInfo_v2(self, free: Any, total: Any) -> int:
        assert self.gpu is not None
        free._obj.value = self.gpu.free
        total._obj.value = self.gpu.free + GIB
        return self._ok("cuMemGetInfo_v2")

    def cuMemAlloc_v2(self, ptr: Any, size: Any) -> int:
        assert self.gpu is not None
        used = sum(s for s, _ in self.pieces.values())
        if used + size.value > self.gpu.free - 10 * MIB:  # the driver keeps a little
            self.calls.append("cuMemAlloc_v2")
            return 2
        ptr._obj.value = self._next
        self.pieces[self._next] = [size.value, 0]
        self._next += size.value
        return self._ok("cuMemAlloc_v2")

    def cuMemFree_v2(self, ptr: Any) -> int:
        del self.pieces[ptr.value]
        return self._ok("cuMemFree_v2")

    def cuMemsetD8_v2(self, ptr: Any, byte: Any, n: Any) -> int:
        assert self.pieces[ptr.value][0] == n.value  # whole pieces
        self.pieces[ptr.value][1] = byte.value
        return self._ok("cuMemsetD8_v2")

    def cuMemcpyDtoH_v2(self, dst: Any, src: Any, n: Any) -> int:
        assert self.gpu is not None
        start = max(p for p in self.pieces if p <= src.value)
        size, byte = self.pieces[start]
        assert src.value + n.value <= start + size, "read past the piece"
        ctypes.memset(dst.value, 0 if self.gpu.forgets else byte, n.value)
        return self._ok("cuMemcpyDtoH_v2")

    def cuMemcpyDtoD_v2(self, dst: Any, src: Any, n: Any) -> int:
        self.copied = n.value
        return self._ok("cuMemcpyDtoD_v2")

    def cuEventCreate(self, ev: Any, flags: int) -> int:
        rc = self._ok("cuEventCreate")
        if rc == 0:
            self.events += 1
            ev._obj.value = 0x2000 + self.events
        return rc

    def cuEventRecord(self, ev: Any, stream: Any) -> int:
        return self._ok("cuEventRecord")

    def cuEventSynchronize(self, ev: Any) -> int:
        return self._ok("cuEventSynchronize")

    def cuEventElapsedTime(self, ms: Any, start: Any, end: Any) -> int:
        assert self.gpu is not None
        ms._obj.value = 2 * self.copied / (self.gpu.rate_gbps * 1e9) * 1000
        return self._ok("cuEventElapsedTime")

    def cuEventDestroy_v2(self, ev: Any) -> int:
        self.events -= 1
        return self._ok("cuEventDestroy_v2")


UUID = "GPU-5d2b3c1e-0f4a-4b7e-9c11-2a3b4c5d6e7f"
NVML_BUS = "00000000:3B:00.0"


def one_gpu(**kw: Any) -> FakeCuda:
    return FakeCuda([FakeGpu(bus_id="0000:3b:00.0", uuid=UUID, free=24 * GIB, **kw)])


def test_the_bus_id_and_uuid_read_as_nvml_writes_them() -> None:
    assert cuda_bus_id(NVML_BUS) == "0000:3b:00.0"
    assert uuid_text(uuid.UUID(UUID.removeprefix("GPU-")).bytes) == UUID


def test_all_free_memory_is_allocated_written_read_back_and_timed() -> None:
    cu = one_gpu(rate_gbps=936.0)
    proved = prove(Driver(cu), NVML_BUS, UUID, pattern=0xA5)
    # 24 GiB free, less the slack: 23 whole GiB, then smaller pieces down to 16 MiB
    budget = 24 * GIB - SLACK
    assert budget - 32 * MIB < proved.allocated <= budget
    assert proved.allocated >= 23 * CHUNK
    assert proved.bandwidth_gbps == pytest.approx(936.0)
    assert cu.calls.count("cuMemsetD8_v2") == cu.calls.count("cuMemFree_v2")
    assert cu.calls.count("cuMemcpyDtoH_v2") >= 3 * 23  # start, middle, end of each piece
    assert cu.calls.count("cuEventElapsedTime") == 5
    assert (cu.contexts, cu.events, cu.pieces) == (0, 0, {})  # all given back


def test_memory_that_loses_what_was_written_fails_and_is_given_back() -> None:
    cu = one_gpu(forgets=True)
    with pytest.raises(CudaError, match="lost what was written"):
        prove(Driver(cu), NVML_BUS, UUID, pattern=0x5A)
    assert (cu.contexts, cu.pieces) == (0, {})


def test_a_device_that_is_not_the_gpu_nvml_named_is_refused() -> None:
    cu = one_gpu()
    other = "GPU-00000000-0000-4000-8000-000000000000"
    with pytest.raises(CudaError, match="not GPU-00000000"):
        prove(Driver(cu), NVML_BUS, other, pattern=1)
    assert cu.contexts == 0 and "cuCtxCreate_v2" not in cu.calls
    with pytest.raises(CudaError, match=r"cuDeviceGetByPCIBusId failed.*INVALID_DEVICE"):
        prove(Driver(cu), "00000000:AF:00.0", UUID, pattern=1)


@pytest.mark.parametrize("call", ["cuMemsetD8_v2", "cuMemcpyDtoD_v2", "cuEventCreate"])
def test_every_failing_call_is_named_and_everything_is_given_back(call: str) -> None:
    cu = one_gpu(fail=call)
    with pytest.raises(CudaError, match=f"{call} failed: CUDA_ERROR_OUT_OF_MEMORY"):
        prove(Driver(cu), NVML_BUS, UUID, pattern=1)
    assert (cu.contexts, cu.events, cu.pieces) == (0, 0, {})


def test_a_gpu_with_nothing_free_proves_nothing() -> None:
    cu = FakeCuda([FakeGpu(bus_id="0000:3b:00.0", uuid=UUID, free=SLACK + 8 * MIB)])
    with pytest.raises(CudaError, match="no device memory could be allocated"):
        prove(Driver(cu), NVML_BUS, UUID, pattern=1)
    assert cu.contexts == 0


def test_the_real_library_is_absent_here_or_loads() -> None:
    """Driver.load: CudaUnavailable without libcuda.so.1 (this machine has no driver)."""
    from gpufleet_node_agent.host.cuda import CudaUnavailable

    try:
        Driver.load()
    except CudaUnavailable as exc:
        assert "no CUDA driver library" in str(exc)
