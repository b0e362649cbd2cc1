"""A worker's secrets sealed to the key of the node that runs it (R-JOB-7). Pure: no I/O.

A node's agent keeps an X25519 key pair and sends the public half with every RegisterNode;
the provisioner carries it here in NodeRegistered, and the fleet keeps it if a box can be
sealed to it (`accepted`). At placement (placing.py) `seal` puts the worker's env values,
its image pull's credential and its attached keys in one sealed box to that key
(gpufleet_auth.sealing): StartWorker's clear fields stay empty, so the bus, the commands
stream, an operator's subscription and a dead letter see none of them, and only that node
opens them. A node without a key takes no job that carries secrets (placement.UNSEALED).
"""

from __future__ import annotations

from gpufleet_auth import sealing
from gpufleet_contracts.jobs import SealedSecrets, SecretFields

from .keyuse import WorkerSecrets


class Unsealed(Exception):
    """A worker with secrets was placed on a node without a sealing key (placement rules
    that out): nothing is sent, rather than its secrets in clear."""


def accepted(public_key: str | None) -> str | None:
    """A node's sealing key as the fleet keeps it: None unless a box can be sealed to it."""
    return public_key if sealing.usable(public_key) else None


def seal(secrets: WorkerSecrets, public_key: str | None) -> SealedSecrets | None:
    """The worker's secrets sealed to its node's key; None when it has none."""
    if not secrets.any:
        return None
    if public_key is None:
        raise Unsealed("a worker with secrets was placed on a node without a sealing key")
    fields = SecretFields(
        env=secrets.env, registry_auth=secrets.registry_auth, attached_keys=secrets.attached
    )
    data = fields.model_dump_json(exclude_defaults=True).encode()
    return SealedSecrets(key_id=sealing.key_id(public_key), box=sealing.seal(public_key, data))
