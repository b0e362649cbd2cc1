"""The staging's address guard (staging/guard.py): every refused range, the operator's
allow-list (host:port and networks), IPv6, and a name resolved before it is checked."""

from __future__ import annotations

import ipaddress

import pytest
from gpufleet_node_agent.staging.guard import AddressGuard, refusal
from gpufleet_node_agent.steps.base import WorkerFailed


@pytest.mark.parametrize(
    ("ip", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),  # the cloud's metadata service
        ("fe80::1", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("::ffff:127.0.0.1", "loopback"),  # an IPv4 address written as IPv6
    ],
)
def test_each_range_is_refused(ip: str, why: str) -> None:
    assert refusal(ipaddress.ip_address(ip)) == why


@pytest.mark.parametrize("ip", ["8.8.8.8", "2606:4700:4700::1111", "140.82.112.3"])
def test_public_addresses_pass(ip: str) -> None:
    assert refusal(ipaddress.ip_address(ip)) is None


async def test_a_refused_address_fails_the_worker_naming_the_host() -> None:
    guard = AddressGuard()
    with pytest.raises(WorkerFailed, match=r"refused address 169\.254\.169\.254: link-local"):
        await guard.resolve("169.254.169.254", 80)
    with pytest.raises(WorkerFailed, match=r"refused address ::1: loopback"):
        await guard.resolve("[::1]", 443)


async def test_a_name_is_checked_by_what_it_resolves_to() -> None:
    with pytest.raises(WorkerFailed, match="refused address localhost: loopback"):
        await AddressGuard().resolve("localhost", 9000)
    with pytest.raises(WorkerFailed, match="does not resolve"):
        await AddressGuard().resolve("nothing.invalid", 80)


async def test_the_allow_list_lets_one_host_port_or_a_network_through() -> None:
    guard = AddressGuard.of(["127.0.0.1:9000", "localhost:9001", "10.0.0.0/8", "[::1]:9002"])
    assert await guard.resolve("127.0.0.1", 9000) == "127.0.0.1"
    assert await guard.resolve("localhost", 9001) in ("127.0.0.1", "::1")
    assert await guard.resolve("10.9.8.7", 443) == "10.9.8.7"
    assert await guard.resolve("::1", 9002) == "::1"
    with pytest.raises(WorkerFailed, match="loopback"):
        await guard.resolve("127.0.0.1", 9001)  # another port of it
    with pytest.raises(WorkerFailed, match="private"):
        await guard.resolve("192.168.0.1", 443)


def test_a_name_with_one_refused_address_among_public_ones_is_refused() -> None:
    ips = [ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("10.0.0.1")]
    with pytest.raises(WorkerFailed, match=r"refused address example\.test: private"):
        AddressGuard().check("example.test", 443, ips)
    assert str(AddressGuard().check("example.test", 443, ips[:1])) == "8.8.8.8"
