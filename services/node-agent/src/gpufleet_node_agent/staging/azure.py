"""Azure Blob sources and targets with azure-storage-blob, as the worker's `azure` key
(account name and key: a shared-key credential); a blob (an archive is unpacked) or a
prefix (a path ending in `/`). The account URL is the source's: `https://<account>.blob.
core.windows.net/<container>/...`, or path-style `https://host:port/<account>/<container>/
...` (Azurite) when its first segment is the key's account."""

from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from gpufleet_contracts.locations import AzureSource, OutputTarget, Source

from ..steps.base import WorkerFailed
from .archives import place
from .guard import AddressGuard
from .meter import Meter
from .objects import Counted, digest, each, in_thread, is_prefix, part_file, relative, target_file
from .registry import Keys, Transfer

SINGLE_PUT = 64 * 1024 * 1024  # one Put Blob (the service keeps its Content-MD5) up to this
RETRIES = 2  # the SDK backs off between tries: a refusal is not waited on long


def _failed(shown: str, exc: Exception) -> WorkerFailed:
    from azure.core import exceptions as aexc

    if isinstance(exc, aexc.ResourceNotFoundError):
        return WorkerFailed(f"{shown} not found")
    if isinstance(exc, aexc.ClientAuthenticationError):
        return WorkerFailed(f"{shown} is forbidden")
    if isinstance(exc, aexc.HttpResponseError):
        if exc.status_code == 403:
            return WorkerFailed(f"{shown} is forbidden")
        return WorkerFailed(f"{shown}: Azure refused it ({exc.status_code})")
    return WorkerFailed(f"{shown}: cannot reach Azure ({type(exc).__name__})")


def located(url: str, account: str | None) -> tuple[str, str, str]:
    """(account URL, container, blob path) of a blob's URL."""
    parts = urlsplit(url)
    segments = unquote(parts.path).lstrip("/").split("/")
    base = f"{parts.scheme}://{parts.netloc}"
    if account and segments[0] == account and len(segments) > 1:  # path-style
        base, segments = f"{base}/{account}", segments[1:]
    return base, segments[0], "/".join(segments[1:])


@dataclass(frozen=True)
class Azure:
    guard: AddressGuard
    ca_file: Path | None = None

    async def _container(self, url: str, keys: Keys) -> tuple[Any, str]:
        from azure.storage.blob import BlobServiceClient

        parts = urlsplit(url)
        if not parts.hostname:
            raise WorkerFailed(f"{url[:200]} is not a blob URL")
        await self.guard.resolve(parts.hostname, parts.port or 443)  # the SDK connects by name
        key = keys.get("azure") or {}
        account_url, container, path = located(url, key.get("account_name"))
        credential = (
            {"account_name": key["account_name"], "account_key": key["account_key"]}
            if key.get("account_name") and key.get("account_key")
            else None
        )
        service = BlobServiceClient(
            account_url,
            credential=credential,
            connection_verify=str(self.ca_file) if self.ca_file else True,
            max_single_put_size=SINGLE_PUT,
            retry_total=RETRIES,
        )
        return service.get_container_client(container), path

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, AzureSource)
        container, path = await self._container(source.url, t.keys)
        meter = Meter(source.url, t)
        await in_thread(_failed, source.url, self._fetch, container, path, source.url, dest, meter)
        meter.finish()

    async def version(self, source: Source, t: Transfer) -> str | None:
        """The blob's ETag (a prefix: its blobs' names and ETags), each blob's properties
        read with the worker's key."""
        assert isinstance(source, AzureSource)
        container, path = await self._container(source.url, t.keys)
        return await in_thread(_failed, source.url, self._version, container, path)

    def _version(self, container: Any, path: str) -> str:
        if not is_prefix(path):
            return str(container.get_blob_client(path).get_blob_properties().etag)
        names = [b.name for b in container.list_blobs(name_starts_with=path or None)]
        etags = each(lambda n: container.get_blob_client(n).get_blob_properties().etag, names)
        return digest(zip(names, etags, strict=True))

    def _fetch(self, container: Any, path: str, shown: str, dest: Path, meter: Meter) -> None:
        if is_prefix(path):
            blobs = [
                (b, rel)
                for b in container.list_blobs(name_starts_with=path or None)
                if (rel := relative(shown, path, b.name)) is not None
            ]
            meter.expect(sum(b.size or 0 for b, _ in blobs))
            each(lambda b: self._get(container, b[0].name, target_file(dest, b[1]), meter), blobs)
            return
        meter.expect(container.get_blob_client(path).get_blob_properties().size)
        part = part_file(dest, path)
        self._get(container, path, part, meter)
        place(part, path, dest, shown, meter.t.limit_bytes)

    def _get(self, container: Any, name: str, target: Path, meter: Meter) -> None:
        stream = container.get_blob_client(name).download_blob()
        with target.open("wb") as f:
            out = Counted(f, meter)
            for chunk in stream.chunks():
                out.write(chunk)

    async def put(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        assert isinstance(target, AzureSource)
        url = target.url + path.name if target.url.endswith("/") else target.url
        container, name = await self._container(url, t.keys)
        size = (await asyncio.to_thread(os.stat, path)).st_size
        meter = Meter(url, t, size, bounded=False)
        await in_thread(_failed, url, self._put, container, path, name, url)
        meter.add(size)
        meter.finish()

    def _put(self, container: Any, path: Path, name: str, shown: str) -> None:
        blob = container.get_blob_client(name)
        size = path.stat().st_size
        with path.open("rb") as f:
            blob.upload_blob(f, length=size, overwrite=True, validate_content=True)
        props = blob.get_blob_properties()
        md5 = hashlib.md5()
        with path.open("rb") as f:
            while block := f.read(1024 * 1024):
                md5.update(block)
        stored = props.content_settings.content_md5
        if props.size != size or (stored is not None and bytes(stored) != md5.digest()):
            raise WorkerFailed(f"{shown}: upload not verified (size or MD5 differ)")
        if stored is None and size <= SINGLE_PUT:
            raise WorkerFailed(f"{shown}: upload not verified (no MD5 kept)")
