"""Mount a filesystem image through a loop device with the kernel's own calls: no `mount`
process per worker (issue 15).

`mount -o loop` (util-linux) costs ~4 ms of CPU here, most of it its own start and its scan
of the node's loop devices and mounts (both grow with the workers a node runs); the same
three calls made from the agent cost ~0.6 ms (benchmarks/node_agent/README.md):

1. `LOOP_CTL_GET_FREE` on /dev/loop-control: a free device's number (the kernel makes one
   when none is free);
2. `LOOP_CONFIGURE` on it (Linux 5.8+): backed by the image, with autoclear, so the device
   is detached by itself once nothing holds it: after the unmount, or at once when the
   mount below fails. EBUSY: another process took the same device between 1 and 2, or
   the device is still held (being released after an unmount, say) though the kernel
   calls it free. Asked again, after a short pause; when the kernel names the same busy
   device again, a new one (`LOOP_CTL_ADD`). Up to BUSY_FOR_S; then the worker's error;
3. mount(2) of the device.

Where /dev/loop-control or LOOP_CONFIGURE is missing (an older kernel) `mount(8)` does it
instead (disk.py). What the kernel answers is the error, as mount(8) would report it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import time
from pathlib import Path

CONTROL = Path("/dev/loop-control")
LOOP_CTL_ADD = 0x4C80
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
LO_NAME_SIZE = 64
# struct loop_info64 (linux/loop.h): 5 u64, 4 u32, file name, crypt name, key, 2 u64
_INFO = struct.Struct(f"=5Q4I{LO_NAME_SIZE}s{LO_NAME_SIZE}s32s2Q")
# struct loop_config: u32 fd, u32 block_size, loop_info64, u64 reserved[8]
_CONFIG = struct.Struct(f"=2I{_INFO.size}s64s")
MS_NOSUID, MS_NODEV, MS_NOATIME = 0x2, 0x4, 0x400
BUSY_FOR_S = 10.0  # how long busy devices are asked again before the mount fails

_libc = ctypes.CDLL(None, use_errno=True)


class Unsupported(Exception):
    """This kernel cannot do it this way (mount(8) then does)."""


def _config(backing_fd: int, name: bytes) -> bytes:
    info = _INFO.pack(0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR, name, b"", b"", 0, 0)
    return _CONFIG.pack(backing_fd, 0, info, b"")


def _attach(image: Path) -> tuple[int, str]:
    """An open loop device backed by `image`, autoclear set, and its path."""
    try:
        control = os.open(CONTROL, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise Unsupported(f"{CONTROL} is missing") from exc
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    name = os.fsencode(image)[-(LO_NAME_SIZE - 1) :]  # as losetup shows it
    try:
        deadline = time.monotonic() + BUSY_FOR_S
        pause = 0.001
        busy = -1
        while True:
            number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
            if number == busy:  # "free", yet it refused us: a new device instead
                number = fcntl.ioctl(control, LOOP_CTL_ADD, -1)
            path = f"/dev/loop{number}"
            device = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(device, LOOP_CONFIGURE, _config(backing, name))
                return device, path
            except OSError as exc:
                os.close(device)
                if exc.errno in (errno.EINVAL, errno.ENOTTY):
                    raise Unsupported("LOOP_CONFIGURE is not supported (Linux < 5.8)") from exc
                if exc.errno != errno.EBUSY:
                    raise
            if time.monotonic() >= deadline:
                raise OSError(errno.EBUSY, f"every loop device tried was busy for {BUSY_FOR_S:g} s")
            busy = number
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    finally:
        os.close(backing)
        os.close(control)


def mount(image: Path, mountpoint: Path, fstype: str, data: str = "") -> None:
    """Mount `image` (nosuid, nodev, noatime) at `mountpoint`; OSError as the kernel says."""
    device, path = _attach(image)
    try:
        flags = MS_NOSUID | MS_NODEV | MS_NOATIME
        if (
            _libc.mount(
                os.fsencode(path),
                os.fsencode(mountpoint),
                fstype.encode(),
                ctypes.c_ulong(flags),
                data.encode() or None,
            )
            != 0
        ):
            err = ctypes.get_errno()
            raise OSError(err, f"mount of {image.name}: {os.strerror(err)}")
    finally:
        os.close(device)  # the mount holds it now; without one, autoclear detaches it
