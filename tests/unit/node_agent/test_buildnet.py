"""Where a package build may connect (buildnet.py) and how a build is confined before it runs
(builds.Builder.run): this host's and the control plane's addresses, private, link-local and
loopback ranges refused, the operator's index and list allowed; no table, no build."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from gpufleet_node_agent import buildnet
from gpufleet_node_agent.buildnet import Allowed, AllowError, Target, parse_allow
from gpufleet_node_agent.builds import BuildConfig, Builder, build_argv, index_target
from gpufleet_node_agent.packages import plan
from gpufleet_node_agent.settings import AgentSettings
from pydantic import ValidationError

pytestmark = pytest.mark.unit

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
     |-- 192.0.2.0
        /24 link UNICAST
     |-- 192.0.2.2
        /32 host LOCAL
     |-- 198.51.100.9
        /32 host LOCAL
"""
IF_INET6 = """fe8000000000000000fc00fffe000001 04 40 20 80     eth0
20010db8000000000000000000000002 04 40 00 82     eth0
00000000000000000000000000000001 01 80 10 80       lo
"""


def ip(text: str) -> buildnet.Address:
    return ipaddress.ip_address(text)


def test_the_hosts_own_addresses_are_read_from_proc() -> None:
    assert buildnet.host_addresses(FIB_TRIE, IF_INET6) == (
        ip("127.0.0.1"),
        ip("192.0.2.2"),
        ip("198.51.100.9"),
        ip("fe80::fc:ff:fe00:1"),
        ip("2001:db8::2"),
        ip("::1"),
    )
    assert buildnet.host_addresses("", "") == ()


def test_the_operators_list_is_networks_or_host_and_port() -> None:
    assert parse_allow(" 10.1.2.0/24, 10.1.2.3 ,apt-mirror.lan:80,[fd12::3]:3142,") == (
        Target(None, None, ipaddress.ip_network("10.1.2.0/24")),
        Target(None, None, ipaddress.ip_network("10.1.2.3/32")),
        Target("apt-mirror.lan", 80),
        Target("fd12::3", 3142),
    )
    assert parse_allow("") == ()
    for bad in ("mirror.lan", "mirror.lan:http", "10.1.2.3:0", ":80", "mirror:99999"):
        with pytest.raises(AllowError, match="GPUFLEET_PACKAGE_BUILD_ALLOW entry"):
            parse_allow(bad)


def test_the_ruleset_refuses_the_host_the_control_plane_and_local_ranges() -> None:
    own = buildnet.host_addresses(FIB_TRIE, IF_INET6)
    index = Allowed(ipaddress.ip_network("192.0.2.2/32"), 8080)
    egress = buildnet.egress([index], own, [ip("203.0.113.7")], [ip("10.0.2.3")])
    rules = buildnet.ruleset(egress).splitlines()
    deny4 = next(r for r in rules if r.strip().startswith("ip daddr {"))
    deny6 = next(r for r in rules if r.strip().startswith("ip6 daddr {"))
    for net in (
        "10.0.0.0/8",  # private, slirp's host alias 10.0.2.2 among them
        "127.0.0.0/8",  # collapsed with the host's 127.0.0.1
        "169.254.0.0/16",  # the metadata server
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "192.0.2.2/32",  # this host
        "198.51.100.9/32",  # this host
        "203.0.113.7/32",  # the control plane
    ):
        assert net in deny4, net
    assert "127.0.0.1/32" not in deny4  # an nft interval set refuses overlaps
    for net in ("fc00::/7", "fe80::/10", "::1/128", "2001:db8::2/128", "::ffff:0:0/96"):
        assert net in deny6, net
    assert deny4.endswith("reject with icmpx type admin-prohibited")
    # allowed before refused: DNS to the resolver, the index on its port only
    index_rule = "ip daddr 192.0.2.2/32 tcp dport 8080 accept"
    at = [r.strip() for r in rules]
    assert at.index("ip daddr 10.0.2.3 udp dport 53 accept") < at.index(deny4.strip())
    assert at.index(index_rule) < at.index(deny4.strip())
    assert "policy accept;" in rules[2]  # the internet: Debian's mirror, PyPI


def test_the_index_is_allowed_on_its_own_port() -> None:
    assert index_target("http://10.0.0.5:8080/simple") == Target("10.0.0.5", 8080)
    assert index_target("https://pypi.example/simple") == Target("pypi.example", 443)
    assert index_target("http://pypi.example/simple") == Target("pypi.example", 80)
    assert index_target(None) is None


async def test_a_build_whose_network_cannot_be_confined_does_not_start(tmp_path: Path) -> None:
    """No nft on the node: the container is created and initialised, never started."""
    calls: list[tuple[str, ...]] = []

    async def podman(*args: str) -> tuple[int, bytes, bytes]:
        calls.append(args)
        return 0, b"", b""

    builder = Builder(podman, "podman", {"PATH": str(tmp_path)}, BuildConfig())
    with (tmp_path / "log").open("w") as log:
        run = await builder.run(
            "b1", build_argv("b1", "img", plan({"pip": ["x"]}), builder.config), log
        )
    assert run.error is not None and run.error.startswith("cannot confine the build's network")
    assert "nft (nftables)" in run.error
    assert [c[0] for c in calls] == ["create", "init"]  # no `start`


async def test_the_egress_resolves_the_index_and_the_control_plane(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "fib_trie").write_text(FIB_TRIE)
    config = BuildConfig(
        index_url="http://127.0.0.1:3141/simple",
        allow=parse_allow("10.9.0.0/16,localhost:3142"),
        control_plane=("nats://127.0.0.2:4222", "tls://localhost:4222"),
        proc=proc,
    )

    async def podman(*args: str) -> tuple[int, bytes, bytes]:
        return 0, b"", b""

    egress = await Builder(podman, "podman", {}, config).egress("nameserver 10.0.2.3\n")
    assert egress.dns == (ip("10.0.2.3"),)
    assert Allowed(ipaddress.ip_network("127.0.0.1/32"), 3141) in egress.allowed
    assert Allowed(ipaddress.ip_network("10.9.0.0/16")) in egress.allowed
    assert Allowed(ipaddress.ip_network("127.0.0.1/32"), 3142) in egress.allowed
    assert ipaddress.ip_network("127.0.0.2/32") in egress.denied  # the control plane
    assert ipaddress.ip_network("198.51.100.9/32") in egress.denied  # this host


def test_a_build_gets_a_network_namespace_of_its_own() -> None:
    for shared in ("host", "container:abc", "ns:/proc/1/ns/net"):
        with pytest.raises(ValidationError, match="GPUFLEET_PACKAGE_BUILD_NETWORK"):
            AgentSettings(package_build_network=shared)
    assert AgentSettings(package_build_network="none").package_build_network == "none"
    with pytest.raises(ValidationError, match="GPUFLEET_PACKAGE_BUILD_ALLOW"):
        AgentSettings(package_build_allow="mirror.lan")
