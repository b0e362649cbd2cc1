"""A node's sealing key is kept only when the nkey it enrolled with signed it
(registration.vouched_key): another credential that may publish the node's RegisterNode (an
operator's) cannot have the node's secrets sealed to a key of its own."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet_auth import sealing
from gpufleet_auth.creds import new_user_key, public, seed_of
from gpufleet_auth.sealing import SealingKey
from gpufleet_contracts.nodes import RegisterNode
from gpufleet_provisioner.registration import vouched_key

NODE = new_user_key()  # the nkey the node enrolled with
ENROLLED = {"_id": "m1", "account": "acme", "region": "local", "public_key": public(NODE)}


def registration(key: str | None, signature: str | None) -> RegisterNode:
    return RegisterNode(
        minion_id="m1",
        name="m1",
        region="local",
        owner="acme",
        hostname="m1",
        gpus=[],
        simulated=True,
        inventory_source="test",
        agent_started_at=datetime.now(UTC),
        sealing_key=key,
        sealing_key_signature=signature,
    )


def test_the_nodes_own_key_is_kept() -> None:
    key = SealingKey.generate().public_key
    cmd = registration(key, sealing.vouch(seed_of(NODE), key))
    assert vouched_key(cmd, ENROLLED).sealing_key == key
    assert vouched_key(registration(None, None), ENROLLED).sealing_key is None  # older agent


def test_a_key_the_nodes_nkey_did_not_sign_is_dropped() -> None:
    mine = SealingKey.generate().public_key  # the forger's own key
    operator = new_user_key()
    for signature in (None, sealing.vouch(seed_of(operator), mine)):
        kept = vouched_key(registration(mine, signature), ENROLLED)
        assert kept.sealing_key is None and kept.sealing_key_signature is None
    # the node's word for another key does not carry over to this one
    other = SealingKey.generate().public_key
    forged = registration(mine, sealing.vouch(seed_of(NODE), other))
    assert vouched_key(forged, ENROLLED).sealing_key is None
    assert vouched_key(registration(mine, None), {"_id": "m1"}).sealing_key is None
