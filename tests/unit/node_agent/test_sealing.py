"""Node agent: its sealing key, and a StartWorker's sealed secrets opened in memory
(sealing.py): the worker gets them; a box sealed to an earlier key of the node, or one that
does not open, fails the worker with a reason that holds none of them. No NATS."""

from __future__ import annotations

import hashlib
import json
import logging
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpufleet_auth import Creds
from gpufleet_auth import sealing as boxes
from gpufleet_auth.creds import new_user_key, public, seed_of
from gpufleet_auth.sealing import SealingKey
from gpufleet_bus import BusSettings, Ports, make_broker
from gpufleet_contracts.images import RegistryAuth
from gpufleet_contracts.jobs import (
    SealedSecrets,
    SecretFields,
    WorkerStarted,
    WorkerState,
)
from gpufleet_node_agent import sealing
from gpufleet_node_agent.app import build_app
from gpufleet_node_agent.settings import AgentSettings, default_sim_inventory
from gpufleet_node_agent.worker.manager import WorkerManager

from .test_workers import FakeBroker, cmd, finished

VALUE = "hf-s3cr3t-value"
FIELDS = SecretFields(
    env={"TOKEN": VALUE},
    registry_auth=RegistryAuth(username="me", password=VALUE + "-pw"),
    attached_keys={"huggingface": {"token": VALUE + "-hf"}},
)


def sealed_to(key: SealingKey, data: bytes | None = None) -> SealedSecrets:
    """What the scheduler sends: FIELDS (or `data`) sealed to `key`'s public half."""
    raw = FIELDS.model_dump_json().encode() if data is None else data
    return SealedSecrets(key_id=key.key_id, box=boxes.seal(key.public_key, raw))


def check_secrets() -> list[str]:
    """A worker that exits 0 when TOKEN and its huggingface key file hold the values, without
    any value in its own text."""
    env = hashlib.sha256(VALUE.encode()).hexdigest()
    hf = hashlib.sha256((VALUE + "-hf").encode()).hexdigest()
    code = (
        "import hashlib, os, sys; h = lambda b: hashlib.sha256(b).hexdigest();"
        "f = os.path.join(os.environ['SECRETS_PATH'], 'huggingface', 'token');"
        f"ok = h(os.environ.get('TOKEN', '').encode()) == {env!r}"
        f" and h(open(f, 'rb').read()) == {hf!r};"
        "print('secrets ok' if ok else 'secrets missing'); sys.exit(0 if ok else 3)"
    )
    return [sys.executable, "-c", code]


def test_a_node_makes_its_key_once_and_opens_what_was_sealed_to_it(tmp_path: Path) -> None:
    key = sealing.node_key(tmp_path)
    path = tmp_path / sealing.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sealing.node_key(tmp_path).public_key == key.public_key  # kept, not made again
    start = cmd(sealed_secrets=sealed_to(key))
    assert start.env == {} and VALUE not in start.model_dump_json()
    assert VALUE not in repr(start)
    got = sealing.opened(start, key)
    assert got.env == FIELDS.env and got.registry_auth == FIELDS.registry_auth
    assert got.attached_keys == FIELDS.attached_keys and got.sealed_secrets is None
    plain = cmd(env={"OLD": "scheduler"})  # from a scheduler older than sealing: as it is
    assert sealing.opened(plain, key) is plain


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda mine, earlier: sealed_to(earlier), sealing.EARLIER_KEY),
        (
            lambda mine, earlier: SealedSecrets(key_id=mine.key_id, box=sealed_to(earlier).box),
            sealing.NOT_OPENED,
        ),
        (
            lambda mine, earlier: sealed_to(mine, b'{"env": ["' + VALUE.encode() + b'"]}'),
            sealing.MALFORMED,
        ),
    ],
    ids=["earlier-key", "does-not-open", "malformed"],
)
def test_a_box_that_does_not_open_says_why_and_nothing_it_holds(
    make: Callable[[SealingKey, SealingKey], SealedSecrets], reason: str
) -> None:
    mine, earlier = SealingKey.generate(), SealingKey.generate()
    with pytest.raises(sealing.Unopened) as refused:
        sealing.opened(cmd(sealed_secrets=make(mine, earlier)), mine)
    assert refused.value.reason == reason
    assert refused.value.__cause__ is None and refused.value.__context__ is not None
    assert VALUE not in str(refused.value)
    with pytest.raises(sealing.Unopened, match="no sealing key"):
        sealing.opened(cmd(sealed_secrets=sealed_to(mine)), None)


async def test_the_worker_gets_its_sealed_env_and_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = FakeBroker()
    key = sealing.node_key(tmp_path)
    m = WorkerManager(tmp_path, "m1", broker, gpu_indices=[0], sealing_key=key)
    start = cmd(command=check_secrets(), sealed_secrets=sealed_to(key))
    assert m.start(start) is True
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.log_tail) == (WorkerState.finished, "secrets ok\n")
    spec = json.loads((m.worker_dir("pl-1") / "spec.json").read_text())
    assert spec["env_names"] == ["TOKEN"] and spec["key_types"] == ["huggingface"]
    files = [f for f in m.worker_dir("pl-1").rglob("*") if f.is_file()]
    assert all(VALUE.encode() not in f.read_bytes() for f in files)  # read, then gone
    assert VALUE not in caplog.text


async def test_a_worker_sealed_to_an_earlier_key_of_the_node_fails_with_that_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node's key was replaced (`sealing.key` deleted, the agent restarted) after the
    scheduler sealed this worker's secrets to the earlier one."""
    caplog.set_level(logging.DEBUG)
    earlier = sealing.node_key(tmp_path)
    (tmp_path / sealing.KEY_FILE).unlink()
    now = sealing.node_key(tmp_path)
    assert now.key_id != earlier.key_id
    broker = FakeBroker()
    m = WorkerManager(tmp_path, "m1", broker, gpu_indices=[0], sealing_key=now)
    assert m.start(cmd(command=check_secrets(), sealed_secrets=sealed_to(earlier))) is False
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.reason) == (WorkerState.failed, sealing.EARLIER_KEY)
    assert "sealed to an earlier key of this node" in sealing.EARLIER_KEY
    assert broker.events(WorkerStarted) == []
    d = m.worker_dir("pl-1")
    assert sorted(p.name for p in d.iterdir() if p.name.endswith(".json")) == [
        "exit.json",
        "spec.json",
    ]  # no env.json, keys.json or registry.json: nothing was opened
    assert VALUE not in caplog.text and sealing.EARLIER_KEY in caplog.text


def test_the_agent_registers_the_public_half_of_the_key_it_made(tmp_path: Path) -> None:
    """... vouched for by its credential's nkey, which the provisioner checks."""
    settings = AgentSettings(
        minion_id="box-1",
        agent_state_dir=tmp_path,
        simulated_gpus=default_sim_inventory(),
    )
    nkey = new_user_key()
    creds = Creds(jwt="e30.e30.sig", seed=seed_of(nkey)).write(tmp_path / "node.creds")
    bus = BusSettings(nats_url="nats://127.0.0.1:1", nats_creds=creds)
    agent: Any = build_app(Ports(make_broker("node-agent", bus), bus=bus), settings).core
    key = SealingKey.load(tmp_path / sealing.KEY_FILE)
    assert agent.sealing_key.public_key == key.public_key
    assert agent.workers.sealing_key is agent.sealing_key
    agent.inventory = agent.read_inventory(settings)
    reg = agent.registration()
    assert reg.sealing_key == key.public_key
    assert boxes.vouched(public(nkey), key.public_key, reg.sealing_key_signature)
