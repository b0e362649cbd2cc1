"""Port reservations published with mDNS (R-RES-3, python-zeroconf): `<hostname>.local` on the
node's own addresses of the interfaces its operator allows (GPUFLEET_MDNS_INTERFACES), never
a container bridge's (zeroconf on every interface advertises a bridge's address and forces
`hostname-2`: esphome#6411), as a `_gpufleet._tcp` service on the reservation's port.

A name already answered on the LAN by another host gets one deterministic rename,
`<hostname>-2`, which the worker's log reports; if that is taken too the worker fails: never
a loop of renames (the "-21, -22, -23" of Avahi in containers). Withdrawn (mDNS goodbye)
when the worker ends; a withdrawal twice is nothing.
"""

from __future__ import annotations

import asyncio
import re
import socket
from dataclasses import dataclass

import ifaddr
from zeroconf import IPVersion, NonUniqueNameException, ServiceInfo
from zeroconf._services.info import AddressResolverIPv4  # not in zeroconf.__all__
from zeroconf.asyncio import AsyncZeroconf

SERVICE_TYPE = "_gpufleet._tcp.local."
# Interfaces that are never the LAN's: containers' bridges and veths, tunnels, loopback.
BRIDGES = re.compile(r"^(lo|docker|podman|cni|veth|br-|virbr|cali|flannel|vxlan|tun|tap|wg)")
PROBE_S = 1.0  # how long a name is asked on the LAN before it is taken as free


class PublishFailed(Exception):
    """Why a reservation was not published (never a secret)."""


def parse_interfaces(text: str) -> list[str]:
    """GPUFLEET_MDNS_INTERFACES: interface names, comma-separated; a bridge's is refused
    (ValueError: the agent does not start)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if BRIDGES.match(name):
            raise ValueError(f"{name} is a container bridge, tunnel or loopback, not the LAN")
    return names


def addresses_of(names: list[str]) -> list[str]:
    """The IPv4 addresses of these interfaces (those that exist and have one)."""
    found: list[str] = []
    for adapter in ifaddr.get_adapters():
        if adapter.nice_name in names:
            found += [str(ip.ip) for ip in adapter.ips if isinstance(ip.ip, str)]
    return found


@dataclass(frozen=True)
class Published:
    hostname: str  # as published, without `.local`
    port: int
    renamed_from: str | None = None


class MdnsPublisher:
    def __init__(self, interfaces: list[str], probe_s: float = PROBE_S) -> None:
        self.interfaces = interfaces
        self.probe_s = probe_s
        self._zc: AsyncZeroconf | None = None
        self._addresses: list[str] = []
        self._published: dict[str, ServiceInfo] = {}
        self._lock = asyncio.Lock()

    async def _zeroconf(self) -> AsyncZeroconf:
        if self._zc is None:
            if not self.interfaces:
                raise PublishFailed("this node publishes no mDNS names (GPUFLEET_MDNS_INTERFACES)")
            self._addresses = addresses_of(self.interfaces)
            if not self._addresses:
                raise PublishFailed(f"no IPv4 address on {', '.join(self.interfaces)}")
            self._zc = AsyncZeroconf(interfaces=self._addresses, ip_version=IPVersion.V4Only)
            await self._zc.zeroconf.async_wait_for_start()
        return self._zc

    async def _taken(self, zc: AsyncZeroconf, hostname: str) -> bool:
        """Whether another host answers for `<hostname>.local` now (asked twice: a first
        query may go out before this host's socket hears answers)."""
        for _ in range(2):
            resolver = AddressResolverIPv4(f"{hostname}.local.")
            if await resolver.async_request(zc.zeroconf, int(self.probe_s * 1000)):
                return not set(resolver.parsed_addresses()) <= set(self._addresses)
        return False

    async def publish(self, key: str, hostname: str, port: int) -> Published:
        """`<hostname>.local` → this node, port `port`, for the worker `key` (again: as it
        is). Renamed once to `<hostname>-2` if the LAN has the name; PublishFailed if both."""
        async with self._lock:
            zc = await self._zeroconf()
            held = self._published.get(key)
            if held is not None:
                return Published(str(held.server).removesuffix(".local."), port)
            for candidate in (hostname, f"{hostname}-2"):
                if await self._taken(zc, candidate):
                    continue
                info = ServiceInfo(
                    SERVICE_TYPE,
                    f"{candidate}-{port}.{SERVICE_TYPE}",
                    port=port,
                    addresses=[socket.inet_aton(a) for a in self._addresses],
                    server=f"{candidate}.local.",
                )
                try:
                    await zc.async_register_service(info, allow_name_change=False)
                except NonUniqueNameException:
                    continue
                self._published[key] = info
                renamed = hostname if candidate != hostname else None
                return Published(candidate, port, renamed)
            raise PublishFailed(f"{hostname}.local and {hostname}-2.local are taken on the LAN")

    async def withdraw(self, key: str) -> None:
        async with self._lock:
            info = self._published.pop(key, None)
            if info is not None and self._zc is not None:
                await self._zc.async_unregister_service(info)

    async def close(self) -> None:
        async with self._lock:
            if self._zc is not None:
                await self._zc.async_unregister_all_services()
                await self._zc.async_close()
                self._zc = None
            self._published.clear()
