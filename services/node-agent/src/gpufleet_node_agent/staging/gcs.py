"""Google Cloud Storage sources and targets with google-cloud-storage, as the worker's `gcp`
key's service account; an object (an archive is unpacked) or a prefix (a path ending in
`/`). The operator's emulator endpoint (GPUFLEET_STAGING_GCS_ENDPOINT) is the only place
reached without a key (anonymous credentials)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpufleet_contracts.locations import GcsSource, OutputTarget, Source

from ..steps.base import WorkerFailed
from .archives import place
from .guard import AddressGuard
from .meter import Meter
from .objects import (
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


def _failed(shown: str, exc: Exception) -> WorkerFailed:
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.NotFound):
        return WorkerFailed(f"{shown} not found")
    if isinstance(exc, (gexc.Forbidden, gexc.Unauthorized)):
        return WorkerFailed(f"{shown} is forbidden")
    if isinstance(exc, gexc.GoogleAPICallError):
        return WorkerFailed(f"{shown}: GCS refused it ({exc.code})")
    return WorkerFailed(f"{shown}: cannot reach GCS ({type(exc).__name__})")


def _download(blob: Any, path: Path, meter: Meter) -> None:
    with path.open("wb") as f:
        blob.download_to_file(Counted(f, meter))


@dataclass(frozen=True)
class Gcs:
    guard: AddressGuard
    endpoint: str | None = None  # an emulator's URL; None: Google's

    async def _client(self, shown: str, keys: Keys) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.storage import Client
        from google.oauth2 import service_account

        options: dict[str, str] = {}
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if not parts.hostname:
                raise WorkerFailed(f"GCS endpoint {self.endpoint[:200]} is not a URL")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            await self.guard.resolve(parts.hostname, port)
            options["api_endpoint"] = self.endpoint
        key_json = keys.get("gcp", {}).get("key_json")
        if key_json:
            try:
                info = json.loads(key_json)
                credentials = service_account.Credentials.from_service_account_info(info)  # type: ignore[no-untyped-call]
            except (ValueError, KeyError):
                raise WorkerFailed("the attached gcp key is not a service account's JSON") from None
            project = info.get("project_id")
        elif self.endpoint is not None:
            credentials, project = AnonymousCredentials(), "gpufleet"  # type: ignore[no-untyped-call]
        else:
            raise WorkerFailed(f"{shown} is forbidden: the job attached no gcp key")
        return await asyncio.to_thread(
            Client, project=project, credentials=credentials, client_options=options or None
        )

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, GcsSource)
        client = await self._client(source.url, t.keys)
        meter = Meter(source.url, t)
        await in_thread(_failed, source.url, self._fetch, client, source.url, dest, meter)
        meter.finish()

    async def version(self, source: Source, t: Transfer) -> str | None:
        """The object's generation (a prefix: its objects' names and generations), each
        object's metadata read with the worker's key (the right a download needs)."""
        assert isinstance(source, GcsSource)
        client = await self._client(source.url, t.keys)
        return await in_thread(_failed, source.url, self._version, client, source.url)

    def _version(self, client: Any, shown: str) -> str:
        bucket, key = bucket_key(shown)
        names = [b.name for b in client.list_blobs(bucket, prefix=key)] if is_prefix(key) else [key]

        def generation(name: str) -> str:
            blob = client.bucket(bucket).get_blob(name)
            if blob is None:
                raise WorkerFailed(f"{shown} not found")
            return str(blob.generation)

        gens = each(generation, names)
        return digest(zip(names, gens, strict=True)) if is_prefix(key) else gens[0]

    def _fetch(self, client: Any, shown: str, dest: Path, meter: Meter) -> None:
        bucket, key = bucket_key(shown)
        if is_prefix(key):
            blobs = [
                (b, rel)
                for b in client.list_blobs(bucket, prefix=key)
                if (rel := relative(shown, key, b.name)) is not None
            ]
            meter.expect(sum(b.size or 0 for b, _ in blobs))
            each(lambda b: _download(b[0], target_file(dest, b[1]), meter), blobs)
            return
        blob = client.bucket(bucket).get_blob(key)
        if blob is None:
            raise WorkerFailed(f"{shown} not found")
        meter.expect(blob.size or 0)
        part = part_file(dest, key)
        with part.open("wb") as f:
            blob.download_to_file(Counted(f, meter))
        place(part, key, dest, shown, meter.t.limit_bytes)

    async def put(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        assert isinstance(target, GcsSource)
        bucket, key = bucket_key(target.url)
        if is_prefix(key):
            key += path.name
        shown = f"gs://{bucket}/{key}"
        client = await self._client(shown, t.keys)
        size = (await asyncio.to_thread(os.stat, path)).st_size
        meter = Meter(shown, t, size, bounded=False)
        await in_thread(_failed, shown, self._put, client, path, bucket, key, shown)
        meter.add(size)
        meter.finish()

    def _put(self, client: Any, path: Path, bucket: str, key: str, shown: str) -> None:
        blob = client.bucket(bucket).blob(key)
        blob.upload_from_filename(str(path))
        blob.reload()
        md5 = hashlib.md5()
        with path.open("rb") as f:
            while block := f.read(1024 * 1024):
                md5.update(block)
        sent = base64.b64encode(md5.digest()).decode()
        if blob.size != path.stat().st_size or blob.md5_hash != sent:
            raise WorkerFailed(f"{shown}: upload not verified (size or MD5 differ)")
