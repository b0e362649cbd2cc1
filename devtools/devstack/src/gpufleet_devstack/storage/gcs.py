"""Google Cloud Storage on 127.0.0.1: gcp-storage-emulator (PyPI) as a child process, its
objects under `root`.

The real client (google-cloud-storage) reaches it through `client_options={"api_endpoint":
...}` or the variable it reads itself, STORAGE_EMULATOR_HOST, with anonymous credentials:
the emulator checks none.
"""

from __future__ import annotations

import contextlib
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpufleet_devstack.storage.rooted import RootedServer, running

__all__ = ["GcsEndpoint", "GcsServer", "running_gcs"]


@dataclass(frozen=True)
class GcsEndpoint:
    """What a GCS client needs: the API endpoint and a project (any name works)."""

    url: str
    project: str = "gpufleet-dev"

    @property
    def env(self) -> dict[str, str]:
        """The variable google-cloud-storage reads (it then uses no credentials)."""
        return {"STORAGE_EMULATOR_HOST": self.url}


class GcsServer(RootedServer):
    """gcp-storage-emulator on `host:port`, storing under `root`."""

    kind = "gcs (gcp-storage-emulator)"
    log_name = "gcs"
    start_timeout_s = 30.0

    @property
    def endpoint(self) -> GcsEndpoint:
        return GcsEndpoint(f"http://{self.address}")

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gcp_storage_emulator",
            "--data-dir",
            str(self.root),
            "start",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--quiet",
        ]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://{self.address}/storage/v1/b?project=ready", timeout=1
            ):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False


def running_gcs(root: Path) -> contextlib.AbstractContextManager[GcsServer]:
    """A GcsServer storing under `root`, for a block, stopped when it ends."""
    return running(GcsServer(root))
