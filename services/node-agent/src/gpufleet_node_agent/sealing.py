"""This node's sealing key, and a StartWorker's sealed secrets opened with it, in memory.

The key (gpufleet_auth.sealing, X25519) is `sealing.key` in the agent's state directory,
0600 beside `node.creds`; an agent that finds none makes one at its start (so a node
enrolled before keys existed gets one too), and every RegisterNode carries its public half,
signed by the node's credential's nkey (`vouch`: the provisioner keeps no key it did not).
The scheduler seals a worker's env values, its image pull's credential and its attached
keys to it (StartWorker's `sealed_secrets`); `opened` puts them back in the command's clear
fields in memory, where the worker manager reads them (worker/manager.py writes them only to the
worker's own 0600 files). A box that does not open makes the worker fail with a reason that
says why, never what it holds.

Rotation: stop the agent, delete (or replace) `sealing.key`, start it. It registers its new
public key; workers already running keep what they were given (nothing is sealed again); a
StartWorker sealed to the earlier key and read after the change fails (`EARLIER_KEY`).
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path

from gpufleet_auth import Creds
from gpufleet_auth.sealing import EarlierKey, SealError, SealingKey
from gpufleet_auth.sealing import vouch as vouch_with
from gpufleet_contracts.jobs import SecretFields, StartWorker
from pydantic import ValidationError

log = logging.getLogger("gpufleet.node_agent.sealing")

KEY_FILE = "sealing.key"
EARLIER_KEY = (
    "its secrets were sealed to an earlier key of this node (the node's sealing key was "
    "replaced after the worker was placed); submit the job again"
)
NO_KEY = "its secrets are sealed and this node agent has no sealing key"
NOT_OPENED = "its sealed secrets do not open with this node's sealing key"
MALFORMED = "its sealed secrets are not a worker's secrets"


class Unopened(Exception):
    """A StartWorker's sealed secrets that cannot be opened; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def node_key(state_dir: Path) -> SealingKey:
    """The node's sealing key, made at the first start that finds none."""
    path = state_dir.expanduser() / KEY_FILE
    made = not path.exists()
    key = SealingKey.load(path)
    log.info("sealing key %s%s (%s)", key.key_id, " made now" if made else "", path)
    return key


def vouch(key: SealingKey, creds: Path | None) -> str | None:
    """The node's credential (`creds`, its nkey) vouching for `key`: what RegisterNode
    carries beside the public key. None without a credential (nothing would keep the key)."""
    if creds is None or not creds.expanduser().exists():
        return None
    return vouch_with(Creds.read(creds).seed, key.public_key)


class NodeKey:
    """This node's sealing key and its credential's word for it, read (or made) when first
    used, at the agent's start: not when the agent is built (the docs generator and the
    tests build agents that never start)."""

    def __init__(self, state_dir: Path, creds: Path | None) -> None:
        self.state_dir = state_dir
        self.creds = creds

    @cached_property
    def key(self) -> SealingKey:
        return node_key(self.state_dir)

    @cached_property
    def signature(self) -> str | None:
        return vouch(self.key, self.creds)

    def load(self) -> None:
        """Read (or make) the key and its signature now."""
        _ = self.signature

    @property
    def public_key(self) -> str:
        return self.key.public_key

    def open(self, box: str, sealed_to: str) -> bytes:
        return self.key.open(box, sealed_to)


def opened(cmd: StartWorker, key: SealingKey | NodeKey | None) -> StartWorker:
    """`cmd` with its sealed secrets opened into its clear fields; as it is without any
    (from a scheduler older than sealing). Unopened: they cannot be opened here."""
    sealed = cmd.sealed_secrets
    if sealed is None:
        return cmd
    if key is None:
        raise Unopened(NO_KEY)
    try:
        data = key.open(sealed.box, sealed.key_id)
    except EarlierKey:
        raise Unopened(EARLIER_KEY) from None
    except SealError:
        raise Unopened(NOT_OPENED) from None
    try:
        fields = SecretFields.model_validate_json(data)
    except ValidationError:  # its errors quote the input: never raised on, never logged
        raise Unopened(MALFORMED) from None
    return cmd.model_copy(
        update={
            "env": fields.env,
            "registry_auth": fields.registry_auth,
            "attached_keys": fields.attached_keys,
            "sealed_secrets": None,
        }
    )
