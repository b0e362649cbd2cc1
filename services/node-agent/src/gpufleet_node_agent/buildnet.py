"""Where a build container may connect: the internet's registries and the operator's sources,
never this node's or the control plane's services; as plain data and the nftables ruleset that
says it, applied in the build's own network namespace (builds.py). No I/O here.

Refused (`reject`, so a connection fails at once with "no route to host"): loopback, private
(RFC 1918, CGNAT 100.64/10, IPv6 unique local fc00::/7), link-local (169.254/16 and fe80::/10,
the cloud metadata server among them) and reserved ranges; every address of this host's own
interfaces; the control plane's addresses (the NATS servers the agent connects to). Allowed
before those: the container's DNS resolvers (port 53), the operator's package index (its
address and port) and the operator's list (`GPUFLEET_PACKAGE_BUILD_ALLOW`). Anything else
(the internet: Debian's mirror, PyPI) is allowed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

TABLE = "gpufleet_build"
NEVER = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private (and slirp4netns' 10.0.2.2, the host's loopback)
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local: the cloud metadata server
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "224.0.0.0/3",  # multicast, reserved, broadcast
        "::1/128",  # loopback
        "::ffff:0:0/96",  # IPv4-mapped
        "fc00::/7",  # unique local (AWS's IPv6 metadata server fd00:ec2::254 among them)
        "fe80::/10",  # link-local
        "ff00::/8",  # multicast
    )
)


class AllowError(ValueError):
    """An entry of GPUFLEET_PACKAGE_BUILD_ALLOW that is not a network or host:port."""


@dataclass(frozen=True)
class Allowed:
    """Where a build may connect despite NEVER: a network, on one TCP port or any."""

    network: Network
    port: int | None = None


@dataclass(frozen=True)
class Target:
    """An operator's entry before its host name is resolved: `host` and a TCP port, or a
    network (`host` None)."""

    host: str | None
    port: int | None
    network: Network | None = None


@dataclass(frozen=True)
class Egress:
    allowed: tuple[Allowed, ...]
    denied: tuple[Network, ...]
    dns: tuple[Address, ...]


def parse_allow(text: str) -> tuple[Target, ...]:
    """GPUFLEET_PACKAGE_BUILD_ALLOW: comma-separated `network` (`10.1.2.0/24`, `10.1.2.3`,
    `fd12::/64`) or `host:port` (`apt-mirror.lan:80`, `10.1.2.3:3142`, `[fd12::3]:80`)."""
    out = []
    for raw in (t.strip() for t in text.split(",")):
        if not raw:
            continue
        try:
            out.append(Target(None, None, ipaddress.ip_network(raw, strict=False)))
            continue
        except ValueError:
            pass
        host, sep, port = raw.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise AllowError(
                f"GPUFLEET_PACKAGE_BUILD_ALLOW entry {raw!r}: a network (10.1.2.0/24, "
                "10.1.2.3) or host:port (apt-mirror.lan:80, [fd12::3]:80)"
            )
        out.append(Target(host, int(port)))
    return tuple(out)


def host_addresses(fib_trie: str, if_inet6: str) -> tuple[Address, ...]:
    """This host's own addresses, from /proc/net/fib_trie (IPv4: an address followed by a
    `/32 host LOCAL` line) and /proc/net/if_inet6 (IPv6: the first column, in hex)."""
    found: list[Address] = []
    last: str | None = None
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith("|--"):
            last = text[3:].strip()
        elif text.startswith("/32 host LOCAL") and last is not None:
            found.append(ipaddress.IPv4Address(last))
    for line in if_inet6.splitlines():
        cols = line.split()
        if cols and len(cols[0]) == 32:
            found.append(ipaddress.IPv6Address(int(cols[0], 16)))
    return tuple(dict.fromkeys(found))


def nameservers(resolv_conf: str) -> tuple[Address, ...]:
    """The `nameserver` addresses of a resolv.conf (the build container's)."""
    out: list[Address] = []
    for line in resolv_conf.splitlines():
        cols = line.split()
        if len(cols) >= 2 and cols[0] == "nameserver":
            try:
                out.append(ipaddress.ip_address(cols[1].split("%")[0]))
            except ValueError:
                continue
    return tuple(out)


def egress(
    allowed: Iterable[Allowed],
    own: Iterable[Address],
    control_plane: Iterable[Address],
    dns: Sequence[Address],
) -> Egress:
    """The build's egress: `allowed` (the index, the operator's list), then refused NEVER,
    this host's `own` addresses and the `control_plane`'s."""
    denied = [*NEVER, *(ipaddress.ip_network(a) for a in (*own, *control_plane))]
    return Egress(tuple(allowed), tuple(dict.fromkeys(denied)), tuple(dns))


def _family(n: Network | Address) -> str:
    return "ip" if n.version == 4 else "ip6"


def ruleset(e: Egress) -> str:
    """The nftables script of `e`, for `nft -f -` in the build's network namespace: one
    table of its own, its output chain's rules in order, the rest accepted."""
    rules = ['oifname "lo" accept']
    for a in e.dns:
        rules += [f"{_family(a)} daddr {a} {proto} dport 53 accept" for proto in ("udp", "tcp")]
    for allow in e.allowed:
        port = "" if allow.port is None else f" tcp dport {allow.port}"
        rules.append(f"{_family(allow.network)} daddr {allow.network}{port} accept")
    for family in ("ip", "ip6"):
        # collapsed: an nft interval set refuses overlapping elements (10.0.0.0/8, 10.1.2.3)
        same = [n for n in e.denied if _family(n) == family]
        nets = [str(n) for n in ipaddress.collapse_addresses(same)]  # type: ignore[type-var]
        if nets:
            rules.append(
                f"{family} daddr {{ {', '.join(nets)} }} reject with icmpx type admin-prohibited"
            )
    body = "\n".join(f"    {r}" for r in rules)
    return (
        f"table inet {TABLE} {{\n"
        "  chain output {\n"
        "    type filter hook output priority 0; policy accept;\n"
        f"{body}\n"
        "  }\n"
        "}\n"
    )
