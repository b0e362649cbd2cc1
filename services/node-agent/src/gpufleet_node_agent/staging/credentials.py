"""A worker's attached keys as the staging reads them: the files steps/keys.py made of them
(`<worker_dir>/secrets/<type>/<field>`), read back into {type: {field: value}}."""

from __future__ import annotations

from pathlib import Path

from ..steps.keys import SECRETS_DIR
from .registry import Keys


def keys_of(worker_dir: Path) -> Keys:
    """The worker's keys; {} when it has none (or they are gone: it has ended)."""
    root = worker_dir / SECRETS_DIR
    if not root.is_dir():
        return {}
    keys: dict[str, dict[str, str]] = {}
    for kind in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        fields = {
            f.name: f.read_text()
            for f in kind.iterdir()
            if f.is_file() and not f.is_symlink() and not f.name.startswith(".")
        }
        keys[kind.name] = fields
    return keys
