"""A worker's attached third-party keys (R-JOB-7) as files, for that worker alone.

StartWorker's sealed `attached_keys` ({type: {field: value}}) arrive in the worker's
`keys.json` (0600, written with the directory, never in spec.json, which keeps the types
only: `key_types`). `materialize` turns it into one file per field:

    <worker_dir>/secrets/<type>/<field>     0400, owned by the worker's uid; dirs 0500

and deletes keys.json. A container sees that directory, read-only, at `/run/secrets`
(`/run/secrets/huggingface/token`); a bare process (the operator's opt-in) at its own path.
Both get `SECRETS_PATH` naming it. Another worker's container has no bind of it, so cannot
name it.

When the agent can mount (root, as the container runtime needs anyway) `secrets/` is a
small tmpfs (`size=1m`, nosuid, nodev, noexec): the values never reach the node's disk.
Otherwise it is a plain directory (logged). `remove` unmounts and deletes it once the
worker has ended; both steps are idempotent, so a crash midway is finished later.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..images import REGISTRY_FILE
from ..worker.files import read_json
from ..worker.layout import ENV_FILE
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker

log = logging.getLogger("gpufleet.node_agent.keys")

KEYS_FILE = "keys.json"  # StartWorker's attached_keys: 0600, until materialized
SECRETS_DIR = "secrets"
CONTAINER_PATH = "/run/secrets"
ENV_NAME = "SECRETS_PATH"
TMPFS_OPTIONS = "size=1m,mode=0700,nosuid,nodev,noexec"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # a key type or field: never a path


def _writable(d: Path) -> None:
    """Make a materialized tree writable again (a re-run, or its removal without root)."""
    for root, dirs, _ in os.walk(d):
        os.chmod(root, 0o700)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)


def _mount(d: Path) -> bool:
    if os.geteuid() != 0:
        return False
    if os.path.ismount(d):
        return True
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", TMPFS_OPTIONS, "gpufleet-keys", str(d)],
        capture_output=True,
        check=False,
    )
    if res.returncode != 0:
        log.warning("keys of %s on disk: tmpfs mount failed: %s", d.parent.name, res.stderr[-200:])
    return res.returncode == 0


def _write(path: Path, value: str, uid: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    try:
        os.write(fd, value.encode())
        if os.geteuid() == 0:
            os.fchown(fd, uid, uid)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def materialize(worker_dir: Path, uid: int) -> str | None:
    """keys.json (if any) as files for `uid`; None, or why not (the worker then fails)."""
    src = worker_dir / KEYS_FILE
    keys = read_json(src)
    if keys is None:
        return None
    error = write_keys(worker_dir / SECRETS_DIR, keys, uid)
    if error is None:
        src.unlink(missing_ok=True)
    return error


def write_keys(d: Path, keys: dict[str, Any], uid: int) -> str | None:
    """`keys` ({type: {field: value}}) as `d/<type>/<field>` files for `uid` (`d` a small
    tmpfs when the agent can mount); None, or why not (naming a path, never a value)."""
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        if not _mount(d):
            log.info("keys of %s are in a directory on disk until it ends", d.parent.name)
        _writable(d)
        for key_type, fields in keys.items():
            if not _NAME.fullmatch(key_type) or not isinstance(fields, dict):
                return f"attached key type {key_type[:64]!r} is not a valid name"
            td = d / key_type
            td.mkdir(mode=0o700, exist_ok=True)
            for name, value in fields.items():
                if not _NAME.fullmatch(name):
                    return f"attached key {key_type}: field {name[:64]!r} is not a valid name"
                _write(td / name, str(value), uid)
        for sub in [*(p for p in d.iterdir() if p.is_dir()), d]:
            if os.geteuid() == 0:
                os.chown(sub, uid, uid)
            os.chmod(sub, 0o500)
    except OSError as exc:  # its message names a path, never a value
        return f"cannot write the worker's attached keys: {exc.strerror or exc}"
    return None


def remove(worker_dir: Path) -> None:
    """The worker has ended: its keys are gone from the node (and keys.json, if left)."""
    (worker_dir / KEYS_FILE).unlink(missing_ok=True)
    remove_keys(worker_dir / SECRETS_DIR)


def remove_keys(d: Path) -> None:
    """The key files under `d` gone (its tmpfs unmounted). Safe twice."""
    if os.path.ismount(d):
        # lazy: a container being removed may still hold the bind for a moment
        subprocess.run(["umount", "-l", str(d)], capture_output=True, check=False)
    if d.exists():
        with contextlib.suppress(OSError):
            _writable(d)
        shutil.rmtree(d, ignore_errors=True)


def host_path(worker_dir: Path) -> Path:
    return worker_dir / SECRETS_DIR


class KeysStep:
    """The worker's attached keys as its files, for the user its runtime runs it as; gone
    again once it has ended, with whatever of its other secrets is left (env.json and
    registry.json of a worker that never launched). Keeps no done-marker: once written,
    keys.json is gone and running it again does nothing."""

    name = StepName.keys
    marked = False

    def __init__(self, uid: int) -> None:
        self.uid = uid  # who owns the key files: the worker's user

    async def setup(self, w: Worker) -> None:
        error = materialize(w.dir, self.uid)
        if error is not None:
            raise WorkerFailed(error)

    async def teardown(self, w: Worker) -> None:
        remove(w.dir)  # its keys leave the node with it
        w.file(ENV_FILE).unlink(missing_ok=True)
        w.file(REGISTRY_FILE).unlink(missing_ok=True)
