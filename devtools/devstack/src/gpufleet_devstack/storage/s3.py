"""Amazon S3 on 127.0.0.1: moto's server (`python -m moto.server`) as a child process.

Its buckets live in the server's memory: a restart empties them (`just up --data` fills its
demo bucket at each start). It accepts any credentials; the clients are given `S3Endpoint`'s
so that they sign their requests as they would against AWS.
"""

from __future__ import annotations

import contextlib
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet_devstack.storage.rooted import RootedServer, running

__all__ = ["S3Endpoint", "S3Server", "running_s3"]


@dataclass(frozen=True)
class S3Endpoint:
    """What an S3 client needs: the endpoint URL and credentials (any pair works)."""

    url: str
    access_key_id: str = "gpufleet-dev"
    secret_access_key: str = "gpufleet-dev-secret"
    region: str = "us-east-1"

    def boto3_kwargs(self) -> dict[str, Any]:
        """`boto3.client("s3", **endpoint.boto3_kwargs())`."""
        return {
            "endpoint_url": self.url,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "region_name": self.region,
        }


class S3Server(RootedServer):
    """moto's S3 on `host:port`; its log beside `root` (it keeps no files)."""

    kind = "s3 (moto)"
    log_name = "s3"
    start_timeout_s = 30.0

    @property
    def endpoint(self) -> S3Endpoint:
        return S3Endpoint(f"http://{self.address}")

    def _argv(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]

    def _ready(self) -> bool:
        try:  # the list of buckets (unsigned: moto does not check)
            with urllib.request.urlopen(f"http://{self.address}/", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False


def running_s3(root: Path) -> contextlib.AbstractContextManager[S3Server]:
    """An S3Server for a block, stopped when it ends."""
    return running(S3Server(root))
