"""The platform's own datasets, models and checkpoints (`platform` sources and output targets,
R-JOB-3, R-JOB-4): the node never holds the store's credentials and never chooses whose
object it gets.

It asks the scheduler (`nrpc.scheduler.<verb>.<minion_id>`: only this node's credential may
publish it, and the answer comes back to the node's own inbox) for the object one of its
placements reads or writes; the scheduler checks the placement is this node's and the job
names the object, and answers a presigned URL of the job's owner's object. A read's URL is
GET with httpx (streamed, counted against the transfer's limit) and placed (archives.place:
an archive unpacked, a file kept); a write's URL is PUT the output zip, then
CompletePlatformUpload has the datastore read its size and checksum back.

The URL is a credential: never in a reason or a log (httpx logs request URLs at INFO:
`quiet_http_logs`). Its host is the control plane's store: that one `host:port` is reached
for that one request (GPUFLEET_STAGING_ALLOW is not widened), and never a link-local or
metadata address; no redirect is followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import posixpath
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import nats.errors
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.locations import OutputTarget, PlatformAsset, PlatformRef, Source
from gpufleet_contracts.platform import (
    CompletePlatformUpload,
    PlatformGrant,
    PlatformObjectView,
    StagePlatformObject,
)
from pydantic import BaseModel, ValidationError

from ..steps.base import WorkerFailed
from .archives import CHUNK, SUFFIXES, is_archive, place
from .guard import Address, AddressGuard, refusal, url_host
from .meter import Meter
from .objects import part_file
from .registry import Transfer
from .web import stream_into

if TYPE_CHECKING:
    import httpx

# A request to the control plane over the node's own bus connection: the subject, the body,
# the answer's bytes (agent.py builds it on the broker; nats' timeout or no-responders
# errors when nobody answers).
Requester = Callable[[str, bytes], Awaitable[bytes]]

M = TypeVar("M", bound=BaseModel)

TIMEOUT_S = 30.0
# Never reached, whatever the control plane says: the cloud's metadata services.
METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
NEVER = frozenset({"unspecified", "link-local", "multicast"})


def quiet_http_logs() -> None:
    """httpx logs each request's URL at INFO (httpcore its steps at DEBUG): a presigned URL
    is a credential, so the agent keeps them to warnings."""
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


@dataclass(frozen=True)
class StoreGuard(AddressGuard):
    """The node's guard with the store's one `host:port` allowed, and never a link-local,
    metadata, unspecified or multicast address even so."""

    def check(self, host: str, port: int, ips: Iterable[Address]) -> Address:
        ips = list(ips)
        for ip in ips:
            bare = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
            why = refusal(ip)
            if ip in METADATA or bare in METADATA or why in NEVER:
                raise WorkerFailed(f"refused address {host}: {why or 'metadata'} ({ip})")
        return super().check(host, port, ips)


def placement_of(t: Transfer, what: str) -> tuple[str, str]:
    """The job and placement a transfer is for: what the scheduler is asked about."""
    if t.job_id is None or t.placement_id is None:
        raise WorkerFailed(f"{what}: no placement to ask for it")
    return t.job_id, t.placement_id


@dataclass(frozen=True)
class Platform:
    minion_id: str
    request: Requester
    guard: AddressGuard
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        quiet_http_logs()

    # --- the scheduler ------------------------------------------------------------------

    async def ask(self, message: Message, what: str, refused: str) -> dict[str, Any]:
        subject = subjects.as_node(message.SUBJECT, self.minion_id)
        try:
            raw = await self.request(subject, message.to_bytes())
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError):
            raise WorkerFailed(f"{what}: the control plane did not answer") from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise WorkerFailed(f"{what}: the control plane's answer is unreadable") from None
        if not isinstance(data, dict):
            raise WorkerFailed(f"{what}: the control plane's answer is unreadable")
        if data.get("ok") is False and isinstance(data.get("error"), dict):
            code = str(data["error"].get("code", ""))
            if code == "not_found":
                raise WorkerFailed(f"{what} not found")
            said = str(data["error"].get("message", ""))[:300]
            raise WorkerFailed(f"{what}: {refused} ({code}: {said})")
        return data

    async def answer(self, message: Message, reply: type[M], what: str, refused: str) -> M:
        """`ask`, its answer read as `reply`."""
        data = await self.ask(message, what, refused)
        try:
            return reply.model_validate(data)
        except ValidationError:
            raise WorkerFailed(f"{what}: the control plane's answer is unreadable") from None

    async def _grant(
        self,
        t: Transfer,
        asset: PlatformAsset,
        name: str | None,
        mode: Literal["read", "write"],
        what: str,
    ) -> PlatformGrant:
        job_id, placement_id = placement_of(t, what)
        asked = StagePlatformObject(
            job_id=job_id,
            placement_id=placement_id,
            worker=t.worker,
            asset=asset,
            name=name,
            mode=mode,
        )
        grant = await self.answer(asked, PlatformGrant, what, "refused")
        if grant.method != ("GET" if mode == "read" else "PUT"):
            raise WorkerFailed(f"{what}: the control plane granted {grant.method}")
        return grant

    # --- the store ------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        import httpx

        context = ssl.create_default_context()
        if self.ca_file is not None:
            context.load_verify_locations(cafile=str(self.ca_file))
        return httpx.AsyncClient(
            verify=context, timeout=TIMEOUT_S, follow_redirects=False, trust_env=False
        )

    async def _send(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        what: str,
        **kwargs: Any,
    ) -> httpx.Response:
        """`method` at the store's `url` (streamed: the caller closes it), connected to the
        address its host resolved to and checked."""
        import httpx

        try:
            target = httpx.URL(url)
        except httpx.InvalidURL:
            raise WorkerFailed(f"{what}: the control plane's store URL is unreadable") from None
        if target.scheme not in ("http", "https") or not target.host:
            raise WorkerFailed(f"{what}: the control plane's store URL is not http(s)")
        port = target.port or (443 if target.scheme == "https" else 80)
        guard = StoreGuard((*self.guard.allow, f"{url_host(target.host)}:{port}"))
        ip = await guard.resolve(target.host, port)
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        headers = {"Host": target.netloc.decode("ascii"), **kwargs.pop("headers", {})}
        request = client.build_request(
            method,
            target.copy_with(host=ip),
            headers=headers,
            extensions=extensions,
            **kwargs,
        )
        try:
            return await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise WorkerFailed(f"{what}: cannot reach the store ({type(exc).__name__})") from None

    @staticmethod
    def _status(what: str, code: int) -> None:
        if code in (404, 410):
            raise WorkerFailed(f"{what} not found in the store")
        if code in (401, 403):
            raise WorkerFailed(f"{what}: refused by the store (HTTP {code})")
        if code >= 300:
            raise WorkerFailed(f"{what}: the store answered HTTP {code}")

    # --- Fetcher, Uploader ----------------------------------------------------------------

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, PlatformRef)
        what = f"{source.asset.value} {source.name}"
        if source.name is None:
            raise WorkerFailed(f"a platform {source.asset.value} source names no object")
        grant = await self._grant(t, source.asset, source.name, "read", what)
        await self.fetch_granted(grant, dest, t, what)

    async def fetch_granted(self, grant: PlatformGrant, dest: Path, t: Transfer, what: str) -> None:
        """The object a read `grant` is for into `dest` (an archive unpacked, a file kept)."""
        import httpx

        key = posixpath.basename(httpx.URL(grant.url).path)
        name = key if is_archive(key) else posixpath.basename(grant.name) or "object"
        await self.download(grant.url, name, dest, t, what)

    async def download(self, url: str, name: str, dest: Path, t: Transfer, what: str) -> None:
        """GET a presigned `url` into `dest` as the file `name` (an archive unpacked)."""
        import httpx

        async with self._client() as client:
            response = await self._send(client, "GET", url, what)
            try:
                self._status(what, response.status_code)
                meter = Meter(what, t)
                part = part_file(dest, name)
                await stream_into(response, part, meter)
            except httpx.HTTPError as exc:
                raise WorkerFailed(f"{what}: cannot read it ({type(exc).__name__})") from None
            finally:
                await response.aclose()
        meter.finish()
        # named in reasons by its name, with the archive's suffix that says how to unpack it
        suffix = next((x for x in SUFFIXES if name.lower().endswith(x)), "")
        await asyncio.to_thread(place, part, name, dest, what + suffix, t.limit_bytes)

    async def put(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        assert isinstance(target, PlatformRef)
        what = f"{target.asset.value} output"
        grant = await self._grant(t, target.asset, None, "write", what)
        what = f"{target.asset.value} {grant.name}"
        size, sha = await self.upload(path, grant.url, t, what)
        done = CompletePlatformUpload(
            job_id=t.job_id or "",
            placement_id=t.placement_id or "",
            worker=t.worker,
            asset=target.asset,
            name=grant.name,
        )
        view = await self.answer(done, PlatformObjectView, what, "upload not verified")
        verified(what, view.state, view.size, view.sha256, size, sha)

    async def upload(self, path: Path, url: str, t: Transfer, what: str) -> tuple[int, str]:
        """PUT the zip `path` at a presigned `url`: its size and SHA-256 as sent."""
        import httpx

        size = (await asyncio.to_thread(path.stat)).st_size
        meter = Meter(what, t, size, bounded=False)
        sha = hashlib.sha256()

        async def body() -> AsyncIterator[bytes]:
            with path.open("rb") as f:
                while chunk := await asyncio.to_thread(f.read, CHUNK):
                    sha.update(chunk)
                    meter.add(len(chunk))
                    yield chunk

        async with self._client() as client:
            response = await self._send(
                client,
                "PUT",
                url,
                what,
                content=body(),
                headers={"Content-Length": str(size), "Content-Type": "application/zip"},
            )
            try:
                await response.aread()
            except httpx.HTTPError as exc:
                raise WorkerFailed(f"{what}: cannot put it ({type(exc).__name__})") from None
            finally:
                await response.aclose()
        self._status(what, response.status_code)
        meter.finish()
        return size, sha.hexdigest()


def verified(
    what: str, state: str, stored: int | None, stored_sha: str | None, size: int, sha: str
) -> None:
    """The store holds what was put (the datastore read its size and checksum back)."""
    if state != "ready" or stored != size:
        raise WorkerFailed(f"{what}: upload not verified (the store holds {stored} bytes)")
    if stored_sha is not None and stored_sha != sha:
        raise WorkerFailed(f"{what}: upload not verified (its checksum differs)")
