"""A .tar.gz of files given as bytes: a model's code as a `web` or `upload` source serves it."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping

__all__ = ["tar_gz"]


def tar_gz(files: Mapping[str, bytes]) -> bytes:
    """The archive of `files` (name -> content), each a plain file readable by all."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
