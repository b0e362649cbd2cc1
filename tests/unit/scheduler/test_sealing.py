"""Secrets for the node alone, on plain data: a worker with secrets goes only to a node with
a sealing key (placement.UNSEALED), and what it is sent opens with that node's key alone
(sealing.py, jobrequest.py, placement.py, index.py, queue.py)."""

from __future__ import annotations

import base64
import random
from dataclasses import replace
from typing import Any

import pytest
from gpufleet_auth.sealing import EarlierKey, SealingKey
from gpufleet_contracts.images import RegistryAuth
from gpufleet_contracts.jobs import JobSpec, SecretFields
from gpufleet_scheduler import jobrequest, sealing
from gpufleet_scheduler.fleet import node_doc, node_view
from gpufleet_scheduler.index import PlacementIndex
from gpufleet_scheduler.keyuse import WorkerSecrets
from gpufleet_scheduler.placement import UNSEALED, NoPlacement, place, rule_out, why_not
from gpufleet_scheduler.queue import Waiting, plan

from .test_placement import node, random_fleet, random_request, req

KEY = SealingKey.generate()
VALUE = "hf-s3cr3t-value"


def sealed_node(nid: str, **kw: Any) -> Any:
    return replace(node(nid, **kw), sealing_key=KEY.public_key)


def test_a_worker_with_secrets_goes_only_to_a_node_with_a_sealing_key() -> None:
    secret = replace(req(), secrets=True)
    old = node("old")  # an agent too old to send a key, or a registration without one
    assert rule_out(secret, old) == UNSEALED
    assert rule_out(req(), old) is None  # a job without secrets still runs there
    assert rule_out(secret, sealed_node("new")) is None
    assert isinstance(place(secret, [old]), NoPlacement)
    assert why_not(secret, [old, sealed_node("busy", free=0)]).explain() == (
        f"1 node: busy (0 of 2 GPUs free, needs 1); 1 node: {UNSEALED}"
    )
    # cheaper does not matter: the sealed node is the only one
    got = place(secret, [node("a-cheap"), sealed_node("b")])
    assert not isinstance(got, NoPlacement) and got.node.node_id == "b"


def test_the_index_agrees_with_the_linear_scan_when_some_nodes_have_no_key() -> None:
    rng = random.Random(26)
    unsealed_reasons = placed_secrets = 0
    for _ in range(30):
        fleet = [
            replace(n, sealing_key=KEY.public_key if rng.random() < 0.6 else None)
            for n in random_fleet(rng, rng.randint(1, 60))
        ]
        index = PlacementIndex(fleet)
        holds = {n.node_id: "j-old" for n in rng.sample(fleet, min(3, len(fleet)))}
        memo: dict[tuple[object, ...], int] = {}  # one pass: a secret search may fail first
        for i in range(40):
            r = replace(random_request(rng, i), secrets=rng.random() < 0.5)
            expected = place(r, list(index.nodes.values()), holds)
            got = index.place(r, holds, memo)
            if isinstance(expected, NoPlacement):
                assert got is None
                reasons = why_not(r, list(index.nodes.values()), holds).reasons
                assert index.explain(r, holds).reasons == reasons
                unsealed_reasons += reasons[UNSEALED] > 0
            else:
                assert got == expected
                assert expected.node.sealing_key is not None or not r.secrets
                placed_secrets += r.secrets
                index.take(got)
    assert unsealed_reasons > 10 and placed_secrets > 20


def test_a_pass_places_the_plain_job_on_the_old_node_and_the_secret_one_waits() -> None:
    index = PlacementIndex([node("old", gpus=1)])
    secret = Waiting(req=replace(req(), job_id="secret", secrets=True), queued_ms=1)
    plain = Waiting(req=replace(req(), job_id="plain"), queued_ms=2)
    result = plan([secret, plain], index, now_ms=3)
    assert [(w.req.job_id, p.node.node_id) for w, p in result.placed] == [("plain", "old")]
    assert result.reasons[("secret", 0)].explain() == f"1 node: {UNSEALED}"


def test_a_workers_secrets_open_with_its_nodes_key_alone() -> None:
    secrets = WorkerSecrets(
        env={"TOKEN": VALUE},
        registry_auth=RegistryAuth(username="me", password=VALUE + "-pw"),
        attached={"huggingface": {"token": VALUE + "-hf"}},
    )
    box = sealing.seal(secrets, KEY.public_key)
    assert box is not None and box.key_id == KEY.key_id
    assert VALUE not in box.model_dump_json() and VALUE not in repr(box)
    assert VALUE.encode() not in base64.b64decode(box.box)
    fields = SecretFields.model_validate_json(KEY.open(box.box, box.key_id))
    assert fields.env == {"TOKEN": VALUE}
    assert fields.registry_auth == secrets.registry_auth
    assert fields.attached_keys == {"huggingface": {"token": VALUE + "-hf"}}
    with pytest.raises(EarlierKey):
        SealingKey.generate().open(box.box, box.key_id)
    assert sealing.seal(WorkerSecrets(env={}), None) is None  # nothing to seal: none needed
    with pytest.raises(sealing.Unsealed):  # never in clear instead
        sealing.seal(secrets, None)


def test_the_fleet_keeps_only_a_key_a_box_can_be_sealed_to() -> None:
    assert sealing.accepted(KEY.public_key) == KEY.public_key
    assert sealing.accepted(base64.b64encode(bytes(32)).decode()) is None
    assert sealing.accepted(None) is None
    kept = sealed_node("a")
    assert node_view(node_doc(kept)) == kept  # checkpoints keep it
    assert node_view({**node_doc(kept), "sealing_key": None}).sealing_key is None


def spec(**kw: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "j", "gpu_types": ["RTX 3090"], "command": ["true"], **kw}
    )


def test_a_job_says_whether_it_carries_secrets_in_every_stored_form() -> None:
    with_env = spec(env={"TOKEN": VALUE})
    with_key = spec(environment={"keys": ["huggingface"]})
    plain = spec()
    for s, carries in ((with_env, True), (with_key, True), (plain, False)):
        r = jobrequest.of_spec(s)
        assert r.secrets is carries
        assert jobrequest.decode({"req": jobrequest.encode_request(r)}).secrets is carries
    # stored before `req` kept it: from the stored spec; a checkpoint's copy: it may
    stored = {
        "req": {
            k: v
            for k, v in jobrequest.encode_request(jobrequest.of_spec(plain)).items()
            if k != "secrets"
        }
    }
    assert jobrequest.decode({**stored, "spec": jobrequest.stored_spec(plain)}).secrets is False
    assert jobrequest.decode({**stored, "spec": jobrequest.stored_spec(with_env)}).secrets is True
    assert jobrequest.decode({**stored, "spec": {}, "env_sealed": "x"}).secrets is True
    assert jobrequest.decode(stored).secrets is True
