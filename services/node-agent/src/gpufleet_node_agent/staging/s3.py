"""S3 sources and targets with boto3: AWS (no endpoint) or another S3 service at the
source's endpoint (wasabi, moto), with the worker's `aws` or `wasabi` key; an object (an
archive is unpacked) or a prefix (a path ending in `/`, synced as a directory)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpufleet_contracts.locations import OutputTarget, S3Source, Source

from ..steps.base import WorkerFailed
from .archives import place
from .guard import AddressGuard
from .meter import Meter
from .objects import (
    ASKED_AT_ONCE,
    Counted,
    bucket_key,
    digest,
    each,
    in_thread,
    is_prefix,
    part_file,
    relative,
    target_file,
)
from .registry import Keys, Transfer

PART = 8 * 1024 * 1024  # multipart from this size on, in parts of it (the ETag's form)
CHUNK = 1024 * 1024
DEFAULT_REGION = "us-east-1"


def _failed(shown: str, exc: Exception) -> WorkerFailed:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404 or code in ("404", "NoSuchKey", "NoSuchBucket"):
            return WorkerFailed(f"{shown} not found")
        if status in (401, 403) or code in ("403", "AccessDenied", "InvalidAccessKeyId"):
            return WorkerFailed(f"{shown} is forbidden ({code or status})")
        return WorkerFailed(f"{shown}: S3 refused it ({code or status})")
    return WorkerFailed(f"{shown}: cannot reach S3 ({type(exc).__name__})")


def multipart_etag(path: Path, part: int = PART) -> str:
    """The ETag S3 gives a file uploaded as boto3 uploads it: the MD5 of one part, or the
    MD5 of the parts' MD5s and their count."""
    digests = []
    with path.open("rb") as f:
        while block := f.read(part):
            digests.append(hashlib.md5(block).digest())
    if len(digests) <= 1 and path.stat().st_size < part:
        return (digests[0] if digests else hashlib.md5(b"").digest()).hex()
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


@dataclass(frozen=True)
class S3:
    guard: AddressGuard
    ca_file: Path | None = None

    async def _client(self, source: S3Source, keys: Keys) -> Any:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        if source.endpoint is not None:  # the SDK connects by name: its addresses checked
            parts = urlsplit(source.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise WorkerFailed(f"S3 endpoint {source.endpoint[:200]} is not an http(s) URL")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            await self.guard.resolve(parts.hostname, port)
        own, other = ("wasabi", "aws") if source.endpoint else ("aws", "wasabi")
        key = keys.get(own) or keys.get(other) or {}
        config = Config(
            retries={"max_attempts": 3},
            signature_version=None if key else UNSIGNED,
            max_pool_connections=ASKED_AT_ONCE,  # a prefix's objects, that many at once
        )
        return await asyncio.to_thread(
            boto3.session.Session().client,
            "s3",
            endpoint_url=source.endpoint,
            aws_access_key_id=key.get("access_key_id"),
            aws_secret_access_key=key.get("secret_access_key"),
            aws_session_token=key.get("session_token"),
            region_name=key.get("region") or DEFAULT_REGION,
            verify=str(self.ca_file) if self.ca_file else None,
            config=config,
        )

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, S3Source)
        client = await self._client(source, t.keys)
        meter = Meter(source.url, t)
        await in_thread(_failed, source.url, self._fetch, client, source.url, dest, meter)
        meter.finish()

    async def version(self, source: Source, t: Transfer) -> str | None:
        """The object's ETag (a prefix: its objects' names and ETags), each object asked
        with the worker's key (a HEAD: the GetObject right a download needs)."""
        assert isinstance(source, S3Source)
        client = await self._client(source, t.keys)
        return await in_thread(_failed, source.url, self._version, client, source.url)

    def _version(self, client: Any, shown: str) -> str:
        bucket, key = bucket_key(shown)
        if not is_prefix(key):
            return str(client.head_object(Bucket=bucket, Key=key)["ETag"])
        names = [
            o["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
            for o in page.get("Contents", [])
        ]
        heads = each(lambda name: client.head_object(Bucket=bucket, Key=name)["ETag"], names)
        return digest(zip(names, heads, strict=True))

    def _fetch(self, client: Any, shown: str, dest: Path, meter: Meter) -> None:
        bucket, key = bucket_key(shown)
        if is_prefix(key):
            objects: list[tuple[str, str]] = []
            total = 0
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
                for o in page.get("Contents", []):
                    rel = relative(shown, key, o["Key"])
                    if rel is not None:
                        objects.append((o["Key"], rel))
                        total += o["Size"]
            meter.expect(total)
            each(lambda o: self._get(client, bucket, o[0], target_file(dest, o[1]), meter), objects)
            return
        meter.expect(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        part = part_file(dest, key)
        self._get(client, bucket, key, part, meter)
        place(part, key, dest, shown, meter.t.limit_bytes)

    def _get(self, client: Any, bucket: str, key: str, path: Path, meter: Meter) -> None:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with path.open("wb") as f:
            out = Counted(f, meter)
            for chunk in body.iter_chunks(CHUNK):
                out.write(chunk)

    async def put(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        assert isinstance(target, S3Source)
        client = await self._client(target, t.keys)
        bucket, key = bucket_key(target.url)
        if is_prefix(key):
            key += path.name
        shown = f"s3://{bucket}/{key}"
        size = (await asyncio.to_thread(os.stat, path)).st_size
        meter = Meter(shown, t, size, bounded=False)
        await in_thread(_failed, shown, self._put, client, path, bucket, key, meter)
        meter.finish()

    def _put(self, client: Any, path: Path, bucket: str, key: str, meter: Meter) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
        client.upload_file(str(path), bucket, key, Config=config, Callback=meter.add)
        head = client.head_object(Bucket=bucket, Key=key)
        size, etag = head["ContentLength"], str(head.get("ETag", "")).strip('"')
        if size != path.stat().st_size or etag != multipart_etag(path):
            raise WorkerFailed(f"s3://{bucket}/{key}: upload not verified (size or ETag differ)")
