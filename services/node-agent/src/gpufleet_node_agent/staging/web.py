"""Files on the web (`web` sources, input only): http(s) streamed with httpx, ftp(s) with
ftplib. Each connection goes to the address the guard checked (https: the name still in
the Host header and TLS's server name); redirects are followed here, each hop checked, at
most MAX_REDIRECTS."""

from __future__ import annotations

import asyncio
import ftplib
import posixpath
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urljoin, urlsplit

from gpufleet_contracts.locations import Source, WebSource

from ..steps.base import WorkerFailed
from .archives import place
from .guard import AddressGuard
from .meter import Meter, shown
from .objects import Counted, part_file
from .registry import Transfer

if TYPE_CHECKING:
    import httpx

MAX_REDIRECTS = 5
TIMEOUT_S = 30.0
REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _name(url: str) -> str:
    """The file's own name, from the URL's path."""
    return posixpath.basename(unquote(urlsplit(url).path).rstrip("/")) or "index.html"


async def stream_into(response: httpx.Response, part: Path, meter: Meter) -> None:
    """A response's body written to `part`, counted by `meter` (which expects the length
    the server says); `part` removed when that fails."""
    length = response.headers.get("content-length")
    if length and length.isdigit():
        meter.expect(int(length))
    try:
        with part.open("wb") as f:
            out = Counted(f, meter)
            async for chunk in response.aiter_bytes():
                out.write(chunk)
    except BaseException:
        await asyncio.to_thread(part.unlink, missing_ok=True)
        raise


@dataclass(frozen=True)
class Web:
    guard: AddressGuard
    ca_file: Path | None = None

    def _tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.ca_file is not None:
            context.load_verify_locations(cafile=str(self.ca_file))
        return context

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, WebSource)
        scheme = urlsplit(source.url).scheme.lower()
        if scheme in ("ftp", "ftps"):
            await self._ftp(source.url, dest, t)
        else:
            await self._http(source.url, dest, t)

    def _client(self) -> httpx.AsyncClient:
        import httpx

        return httpx.AsyncClient(
            verify=self._tls(), timeout=TIMEOUT_S, follow_redirects=False, trust_env=False
        )

    async def _send(
        self, client: httpx.AsyncClient, method: str, url: str
    ) -> tuple[httpx.Response, str]:
        """The response to `method` at `url` after its redirects, each hop's address
        checked (streamed: the caller closes it), and the URL that answered."""
        import httpx

        first = shown(url)
        for _ in range(MAX_REDIRECTS + 1):
            target = httpx.URL(url)
            if target.scheme not in ("http", "https") or not target.host:
                raise WorkerFailed(f"{first}: redirected to a URL that is not http(s)")
            port = target.port or (443 if target.scheme == "https" else 80)
            ip = await self.guard.resolve(target.host, port)
            extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
            request = client.build_request(
                method,
                target.copy_with(host=ip),
                headers={"Host": target.netloc.decode("ascii")},
                extensions=extensions,
            )
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise WorkerFailed(f"{first}: cannot reach it ({type(exc).__name__})") from None
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location:
                await response.aclose()
                url = urljoin(str(target), location)
                continue
            return response, str(target)
        raise WorkerFailed(f"{first}: more than {MAX_REDIRECTS} redirects")

    async def version(self, source: Source, t: Transfer) -> str | None:
        """An http(s) file's ETag, or its Last-Modified and length, from a HEAD (the
        credentials in its URL are the worker's); None where the server says neither, and
        for ftp (not cached)."""
        assert isinstance(source, WebSource)
        if urlsplit(source.url).scheme.lower() not in ("http", "https"):
            return None
        async with self._client() as client:
            response, at = await self._send(client, "HEAD", source.url)
            await response.aclose()
        self._status(shown(source.url), response.status_code)
        h = response.headers
        if h.get("etag") and not h["etag"].startswith("W/"):
            return f"{at} etag {h['etag']}"
        if h.get("last-modified") and h.get("content-length"):
            return f"{at} modified {h['last-modified']} length {h['content-length']}"
        return None

    async def _http(self, url: str, dest: Path, t: Transfer) -> None:
        import httpx

        first = shown(url)
        async with self._client() as client:
            response, at = await self._send(client, "GET", url)
            try:
                self._status(first, response.status_code)
                meter = Meter(first, t)
                name = _name(at)
                part = part_file(dest, name)
                await stream_into(response, part, meter)
            except httpx.HTTPError as exc:
                raise WorkerFailed(f"{first}: cannot reach it ({type(exc).__name__})") from None
            finally:
                await response.aclose()
        meter.finish()
        await asyncio.to_thread(place, part, name, dest, first, t.limit_bytes)

    @staticmethod
    def _status(what: str, code: int) -> None:
        if code in (404, 410):
            raise WorkerFailed(f"{what} not found")
        if code in (401, 403):
            raise WorkerFailed(f"{what} is forbidden (HTTP {code})")
        if code >= 300:
            raise WorkerFailed(f"{what}: HTTP {code}")

    async def _ftp(self, url: str, dest: Path, t: Transfer) -> None:
        parts = urlsplit(url)
        secure = parts.scheme.lower() == "ftps"
        host = parts.hostname or ""
        port = parts.port or 21
        ip = await self.guard.resolve(host, port)
        meter = Meter(shown(url), t)
        path = unquote(parts.path)
        name = _name(url)
        part = part_file(dest, name)

        def get() -> None:
            ftp = ftplib.FTP_TLS(context=self._tls()) if secure else ftplib.FTP()
            try:
                ftp.connect(ip, port, timeout=TIMEOUT_S)
                # TLS checks the name; passive data connections go to the same peer
                # (ftplib does not trust the address PASV names).
                ftp.host = host
                ftp.login(unquote(parts.username or "anonymous"), unquote(parts.password or ""))
                if isinstance(ftp, ftplib.FTP_TLS):
                    ftp.prot_p()
                ftp.voidcmd("TYPE I")
                size = ftp.size(path)
                if size is not None:
                    meter.expect(size)
                with part.open("wb") as f:
                    out = Counted(f, meter)
                    ftp.retrbinary(f"RETR {path}", out.write)
            finally:
                ftp.close()

        try:
            await asyncio.to_thread(get)
        except ftplib.error_perm as exc:
            part.unlink(missing_ok=True)
            code = str(exc)[:3]
            if code == "550":
                raise WorkerFailed(f"{meter.what} not found") from None
            if code in ("530", "532"):
                raise WorkerFailed(f"{meter.what} is forbidden (FTP {code})") from None
            raise WorkerFailed(f"{meter.what}: FTP {code}") from None
        except ssl.SSLCertVerificationError as exc:  # ftps: a server the CAs did not vouch for
            part.unlink(missing_ok=True)
            why = exc.verify_message or "not verified"
            raise WorkerFailed(
                f"{meter.what}: its TLS certificate is not trusted ({why})"
            ) from None
        except (OSError, EOFError, ftplib.Error) as exc:
            part.unlink(missing_ok=True)
            raise WorkerFailed(f"{meter.what}: cannot reach it ({type(exc).__name__})") from None
        except WorkerFailed:
            part.unlink(missing_ok=True)
            raise
        meter.finish()
        await asyncio.to_thread(place, part, name, dest, meter.what, t.limit_bytes)
