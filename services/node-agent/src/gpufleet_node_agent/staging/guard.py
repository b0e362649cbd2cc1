"""No server-side request forgery: the address a transfer connects to, resolved once and
refused when it is the node's own or its network's (loopback, link-local: the cloud's
metadata service, private, ...) unless the operator allows it (GPUFLEET_STAGING_ALLOW).

The clients then connect to the address that was checked, not to the name again (web.py,
git.py); the cloud SDKs (s3.py, gcs.py, azure.py) connect by name, so for them the check is
of the endpoint's addresses before the client is made."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from ..steps.base import WorkerFailed

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

CGNAT = ipaddress.ip_network("100.64.0.0/10")
UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")


def refusal(ip: Address) -> str | None:
    """Why a transfer may not connect to `ip` unless allowed; None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    checks: tuple[tuple[str, bool], ...] = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("carrier-grade NAT", ip in CGNAT),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private or ip in UNIQUE_LOCAL),
        ("not global", not ip.is_global),
    )
    return next((why for why, hit in checks if hit), None)


def host_port(text: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` split; ValueError when it is neither."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not host:port: {text!r}")
    return host.strip("[]").lower(), int(port)


@dataclass(frozen=True)
class AddressGuard:
    """`allow`: what the operator lets transfers reach although the checks refuse it,
    each `host:port` (a name or an address) or a network (`10.0.0.0/8`, `fd00::/8`)."""

    allow: tuple[str, ...] = ()

    @classmethod
    def of(cls, allow: Iterable[str]) -> AddressGuard:
        return cls(tuple(a.strip() for a in allow if a.strip()))

    @property
    def _networks(self) -> list[Network]:
        return [ipaddress.ip_network(a, strict=False) for a in self.allow if "/" in a]

    @property
    def _pairs(self) -> set[tuple[str, int]]:
        return {host_port(a) for a in self.allow if "/" not in a}

    def allowed(self, host: str, port: int, ip: Address) -> bool:
        pairs = self._pairs
        if (host.lower(), port) in pairs or (str(ip), port) in pairs:
            return True
        return any(ip in net for net in self._networks)

    def check(self, host: str, port: int, ips: Iterable[Address]) -> Address:
        """The first of `ips`, when every one may be reached (a name with one private
        address among public ones is refused: it could be answered either way)."""
        ips = list(ips)
        if not ips:
            raise WorkerFailed(f"refused address {host}: it does not resolve")
        for ip in ips:
            why = refusal(ip)
            if why is not None and not self.allowed(host, port, ip):
                raise WorkerFailed(f"refused address {host}: {why} ({ip})")
        return ips[0]

    async def resolve(self, host: str, port: int) -> str:
        """`host` resolved and checked: the address to connect to (as text)."""
        host = host.strip("[]")
        try:
            ips: list[Address] = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except (OSError, UnicodeError):
                raise WorkerFailed(f"refused address {host}: it does not resolve") from None
            ips = list(dict.fromkeys(ipaddress.ip_address(i[4][0]) for i in infos))
        return str(self.check(host, port, ips))


def url_host(ip: str) -> str:
    """An address as a URL's host: an IPv6 one in brackets."""
    return f"[{ip}]" if ":" in ip else ip
