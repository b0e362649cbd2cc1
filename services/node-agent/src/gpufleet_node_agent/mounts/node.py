"""This node's datastore keeper, built from its settings: the adapter they name, the
datastore service asked over the node's own connection, the node's key for SMB passwords."""

from __future__ import annotations

from pathlib import Path

from gpufleet_auth.sealing import SealError
from gpufleet_contracts.datastores import DatastoreMount, MountDatastore, SealedPassword

from ..noderpc import NotAnswered, NotThere, ask_service
from ..sealing import NodeKey
from ..settings import AgentSettings
from ..staging.datastores import parse_roots
from ..staging.platform import Requester
from .bind import BindMounter
from .keeper import AskMount, DatastoreMounts, OpenPassword
from .kernel import KernelMounter
from .port import Mounter, NoDatastore, Unreachable

MOUNTS_DIR = "datastores"  # under the agent's state directory


def mounter(settings: AgentSettings) -> Mounter:
    """The adapter GPUFLEET_DATASTORE_MOUNTER names (bind: under GPUFLEET_DATASTORE_BIND_ROOT)."""
    return make_mounter(
        settings.datastore_mounter,
        settings.datastore_bind_root,
        settings.datastore_probe_timeout_s,
        settings.agent_state_dir / MOUNTS_DIR,
    )


def make_mounter(kind: str, bind_root: Path | None, timeout_s: float, base: Path) -> Mounter:
    """`kind` `bind` (under `bind_root`) or `kernel` (its credentials files under `base`),
    for a node agent and a device agent alike."""
    if kind == "bind":
        if bind_root is None:
            raise ValueError("GPUFLEET_DATASTORE_MOUNTER=bind needs GPUFLEET_DATASTORE_BIND_ROOT")
        return BindMounter(bind_root, timeout_s)
    return KernelMounter(base / ".credentials", timeout_s * 3)


def asker(minion_id: str, request: Requester) -> AskMount:
    """MountDatastore for this node: its answer, NoDatastore, or Unreachable (no answer)."""

    async def ask(name: str) -> DatastoreMount:
        try:
            return await ask_service(request, minion_id, MountDatastore(name=name), DatastoreMount)
        except NotThere:
            raise NoDatastore(f"datastore {name} not found in this node's region") from None
        except NotAnswered as exc:
            raise Unreachable(f"datastore {name} cannot be mounted: {exc}") from None

    return ask


def opener(key: NodeKey | None) -> OpenPassword:
    def open_password(sealed: SealedPassword) -> str:
        if key is None:
            raise Unreachable("this node has no sealing key to open an SMB password with")
        try:
            return key.open(sealed.box, sealed.key_id).decode()
        except SealError as exc:
            raise Unreachable(f"an SMB password this node cannot open: {exc}") from None

    return open_password


def node_datastores(
    settings: AgentSettings, request: Requester | None, key: NodeKey | None
) -> DatastoreMounts:
    """The keeper: the operator's roots (GPUFLEET_REGIONAL_DATASTORES) as they are, any other
    datastore mounted under <agent_state_dir>/datastores/ when a worker needs it."""

    async def no_bus(name: str) -> DatastoreMount:
        raise Unreachable(f"datastore {name}: this agent has no control plane to ask")

    return DatastoreMounts(
        mounter(settings),
        settings.agent_state_dir / MOUNTS_DIR,
        asker(settings.minion_id, request) if request is not None else no_bus,
        opener(key),
        parse_roots(settings.regional_datastores),
    )
