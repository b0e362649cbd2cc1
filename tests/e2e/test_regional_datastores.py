"""A regional datastore through the running system and the CLI (R-RES-1, R-RES-2): added with
`gpufleet datastore add`, mounted by the node agent for a job that reads it (the bind
adapter: this machine's kernel has no NFS or SMB client; its share is a local directory),
the job reading its file at /opt/ml/input; the share gone makes the next job wait with
"datastore nas unreachable", and once it is back the agent mounts it again, without a
restart, and the job runs; a port reservation's hostname resolves through an mDNS browser
while its job runs and is gone after it is cancelled (R-RES-3)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from integration.node_agent.test_reservation_mdns import gone, lan, resolves
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncZeroconf

from .conftest import BARE_OWN_JOBS, System

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


@pytest.fixture(scope="module")
def shares(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shares")


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, shares: Path) -> Iterator[System]:
    env = {
        **BARE_OWN_JOBS,
        "GPUFLEET_DATASTORE_MOUNTER": "bind",
        "GPUFLEET_DATASTORE_BIND_ROOT": str(shares),
        "GPUFLEET_DATASTORE_PROBE_S": "1",
        "GPUFLEET_MDNS_INTERFACES": lan()[0] if lan() else "",
    }
    system = System(tmp_path_factory.mktemp("system"), agent_env=env)
    try:
        system.start()
        yield system
    finally:
        system.stop()


def job_file(system: System, name: str) -> str:
    path = system.root / f"{name}.yaml"
    spec = {
        "name": name,
        "type": "inference",
        "gpu_types": ["RTX 3090"],
        "gpu_count": 1,
        "max_price": 1.0,
        "input_data": {
            "type": "regional_datastore",
            "datastore": "nas",
            "region": "local",
            "path": "/sub",
        },
        # a bare process sees /opt/ml/input where $ML_DATA_PATH says
        "command": ["sh", "-c", 'cat "$ML_DATA_PATH/data.txt"'],
    }
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_a_job_reads_its_datastore_which_is_healed_when_its_server_comes_back(
    system: System, shares: Path
) -> None:
    share = shares / "10.0.0.5" / "export" / "dir2"
    (share / "sub").mkdir(parents=True)
    (share / "sub" / "data.txt").write_text("hello from the datastore\n")
    added = system.json(
        "datastore",
        "add",
        "nas",
        "--region",
        "local",
        "--type",
        "nfs",
        "--address",
        "10.0.0.5",
        "--root-path",
        "/export/dir2",
        "-o",
        "ro",
    )
    assert added["region_id"] == "local/local" and added["password_set"] is False
    listed = system.json("datastore", "list")["datastores"]
    assert [d["name"] for d in listed] == ["nas"]

    first = str(system.json("job", "submit", "-f", job_file(system, "reads-nas"))["id"])
    system.wait_state(first, "finished", timeout=60)
    assert "hello from the datastore" in system.cli("job", "logs", first).stdout

    # the server goes away: the next job waits, saying why
    share.rename(share.with_name("away"))
    second = str(system.json("job", "submit", "-f", job_file(system, "waits-nas"))["id"])
    began = time.monotonic()
    said = ""
    while time.monotonic() - began < 60:
        said = str(system.job(second).get("progress") or "")
        if "datastore nas unreachable" in said:
            break
        time.sleep(0.5)
    assert "waiting: datastore nas unreachable" in said, system.job(second)

    # back (another directory, as a restarted server's): mounted again, the job goes on
    (share / "sub").mkdir(parents=True)
    (share / "sub" / "data.txt").write_text("back again\n")
    system.wait_state(second, "finished", timeout=60)
    assert "back again" in system.cli("job", "logs", second).stdout


def test_a_reserved_hostname_resolves_while_its_job_runs_and_is_gone_after(
    system: System,
) -> None:
    found = lan()
    if found is None:
        pytest.skip("no LAN interface with an IPv4 address")
    added = system.json(
        "reservation",
        "add",
        "web",
        "--region",
        "local",
        "--hostname",
        "gpufleet-e2e",
        "--port",
        "8099",
    )
    assert (added["hostname"], added["port"]) == ("gpufleet-e2e", 8099)
    path = system.root / "reserved.yaml"
    spec = {
        "name": "reserved",
        "type": "training",
        "gpu_types": ["RTX 3090"],
        "gpu_count": 1,
        "max_price": 1.0,
        "reservation": {"region": "local", "name": "web"},
        "command": ["sleep", "300"],
    }
    path.write_text(yaml.safe_dump(spec))
    job = str(system.json("job", "submit", "-f", str(path))["id"])
    system.wait_state(job, "running", timeout=60)

    async def browse(stopped: bool) -> list[str] | bool:
        zc = AsyncZeroconf(interfaces=[found[1]], ip_version=IPVersion.V4Only)
        try:
            return await gone(zc, "gpufleet-e2e") if stopped else await resolves(zc, "gpufleet-e2e")
        finally:
            await zc.async_close()

    assert asyncio.run(browse(False)) == [found[1]]
    system.cli("job", "cancel", job)
    system.wait_state(job, "stopped", timeout=60)
    assert asyncio.run(browse(True)) is True
