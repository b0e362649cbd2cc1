"""Regional datastores (R-RES-1, R-RES-2): an account's NFS or SMB shares in one of its
regions, which its jobs mount through the region's nodes.

A datastore is the account's own, in the account's own region (its id is `<owner>/<region>`:
a bare region name never reaches across accounts). The SMB password is a secret: sent once
in AddDatastore, sealed at rest by the datastore service, never in a reply, an event or a
log (a view says only `password_set`). What a mount may carry is checked here, once, for
the service (on AddDatastore) and the node (before it mounts): `mount_problem`.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from . import limits, subjects
from .base import Command, Event
from .fields import Name, refused_char
from .paths import UnsafePath, contained_path


class DatastoreType(StrEnum):
    nfs = "nfs"
    smb = "smb"


HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
USERNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@$-]{0,63}$")
PASSWORD_CHARS = 256
MAX_OPTIONS = 16

# The mount options an account may ask for, per type: a flag, or a key with the pattern of its
# value. Anything else is refused: no `credentials=`/`password=` (the node passes those), no
# `suid`/`dev`/`exec` games (the node always adds `nosuid,nodev`), no `sloppy`.
_NUMBER = r"[0-9]{1,7}"
_MODE = r"0[0-7]{3}"
OPTIONS: dict[DatastoreType, dict[str, str | None]] = {
    DatastoreType.nfs: {
        "ro": None,
        "rw": None,
        "soft": None,
        "hard": None,
        "noatime": None,
        "nolock": None,
        "noac": None,
        "vers": r"3|4|4\.0|4\.1|4\.2",
        "nfsvers": r"3|4|4\.0|4\.1|4\.2",
        "proto": r"tcp|udp|rdma",
        "port": _NUMBER,
        "timeo": _NUMBER,
        "retrans": r"[0-9]{1,3}",
        "rsize": _NUMBER,
        "wsize": _NUMBER,
        "actimeo": _NUMBER,
        "sec": r"sys|krb5|krb5i|krb5p",
        "nconnect": r"[0-9]{1,2}",
    },
    DatastoreType.smb: {
        "ro": None,
        "rw": None,
        "soft": None,
        "hard": None,
        "noatime": None,
        "nobrl": None,
        "seal": None,
        "noserverino": None,
        "vers": r"1\.0|2\.0|2\.1|3|3\.0|3\.02|3\.1\.1",
        "uid": _NUMBER,
        "gid": _NUMBER,
        "file_mode": _MODE,
        "dir_mode": _MODE,
        "port": _NUMBER,
        "actimeo": _NUMBER,
        "cache": r"strict|none|loose",
        "sec": r"ntlmssp|ntlmsspi|krb5|krb5i",
        "domain": r"[A-Za-z0-9][A-Za-z0-9.-]{0,63}",
        "iocharset": r"utf8",
    },
}
OPTIONS_VALID = {
    kind: ", ".join(k if v is None else f"{k}=<{v}>" for k, v in table.items())
    for kind, table in OPTIONS.items()
}


def option_problem(kind: DatastoreType, option: str) -> str | None:
    """Why `option` may not be asked for on a `kind` mount, or None."""
    key, sep, value = option.partition("=")
    table = OPTIONS[kind]
    if key not in table:
        return f"{option[:40]!r} is not an allowed {kind.value} mount option"
    pattern = table[key]
    if pattern is None:
        return f"{key} takes no value" if sep else None
    if not sep or re.fullmatch(pattern, value) is None:
        return f"{key} takes a value matching {pattern}"
    return None


def options_problem(kind: DatastoreType, options: list[str]) -> str | None:
    """Why this set of options is refused as a whole, or None: each allowed, none twice,
    `ro` with `rw` never, `hard` only with `timeo` and `retrans` (a hard mount without them
    hangs every reader of a server that went away)."""
    if len(options) > MAX_OPTIONS:
        return f"at most {MAX_OPTIONS} mount options"
    keys: list[str] = []
    for option in options:
        problem = option_problem(kind, option)
        if problem is not None:
            return problem
        keys.append(option.partition("=")[0])
    if len(set(keys)) != len(keys):
        return "a mount option is given twice"
    if {"ro", "rw"} <= set(keys) or {"soft", "hard"} <= set(keys):
        return "contradicting mount options (ro and rw, or soft and hard)"
    if "hard" in keys and not {"timeo", "retrans"} <= set(keys):
        return "hard needs timeo and retrans (a hard mount without them hangs on a lost server)"
    return None


def address_problem(address: str) -> str | None:
    """Why `address` is not a server's host name or IP address the nodes may mount from:
    loopback, link-local, multicast and unspecified addresses are refused (a node's own
    services and the cloud metadata address); the region's LAN is where datastores live."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        if HOSTNAME.fullmatch(address) is None:
            return "not a host name or an IP address"
        if address.lower() == "localhost" or address.lower().endswith(".localhost"):
            return "a loopback name"
        return None
    if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return "a loopback, link-local, multicast or unspecified address"
    return None


def root_problem(kind: DatastoreType, root_path: str) -> str | None:
    """Why `root_path` is not an export (NFS) or a share and its directory (SMB, the first
    segment is the share) on the server."""
    try:
        canonical = contained_path(root_path, rooted=True)
    except UnsafePath as exc:
        return str(exc)
    if canonical != root_path:
        return "not in canonical form (decode it first)"
    if "," in root_path or " " in root_path:
        return "a comma or space (they would split the mount's arguments)"
    if kind is DatastoreType.smb and not root_path.strip("/"):
        return "an SMB root names its share (/share or /share/dir)"
    return None


def mount_problem(
    kind: DatastoreType, address: str, root_path: str, options: list[str]
) -> str | None:
    """Why a node must not mount this (checked again where it mounts), or None."""
    for what, problem in (
        ("address", address_problem(address)),
        ("root_path", root_problem(kind, root_path)),
        ("mount_options", options_problem(kind, options)),
    ):
        if problem is not None:
            return f"{what}: {problem}"
    return None


def password_problem(password: str) -> str | None:
    if not password or len(password) > PASSWORD_CHARS:
        return f"1 to {PASSWORD_CHARS} characters"
    if refused_char(password) is not None:
        return "a control character (a credentials file holds one line per field)"
    return None


class DatastoreView(BaseModel):
    """A datastore as its owner sees it: never its password, only whether it has one."""

    model_config = ConfigDict(frozen=True)

    name: str
    region: str
    region_id: str  # `<owner>/<region>`
    type: DatastoreType
    address: str
    root_path: str
    mount_options: list[str]
    username: str | None = None
    password_set: bool = False
    created_at: datetime


class Datastores(BaseModel):
    datastores: list[DatastoreView]


class AddDatastore(Command):
    """A datastore in one of the acting account's regions (R-RES-1: one with a compute node
    or device; a `team` or `enterprise` plan, R-TEN-3). `username` and `password` for SMB
    only; the password is sealed at rest and never shown again."""

    TYPE = "gpufleet.datastore.add_datastore.v1"
    SUBJECT = subjects.rpc("datastore", "add_datastore")
    REPLY = DatastoreView
    region: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    type: DatastoreType
    address: str = Field(min_length=1, max_length=253)
    root_path: str = Field(min_length=1, max_length=1024)
    mount_options: list[str] = Field(default_factory=list, max_length=MAX_OPTIONS)
    username: str | None = Field(default=None, max_length=64)
    password: SecretStr | None = Field(default=None, repr=False)

    @field_validator("password", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        return None if v == "" else v


class ListDatastores(Command):
    """The acting account's datastores, in one of its regions or in all of them."""

    READ = True

    TYPE = "gpufleet.datastore.list_datastores.v1"
    SUBJECT = subjects.rpc("datastore", "list_datastores")
    REPLY = Datastores
    region: Name | None = Field(default=None, max_length=limits.NAME_CHARS)


class GetDatastore(Command):
    READ = True
    TYPE = "gpufleet.datastore.get_datastore.v1"
    SUBJECT = subjects.rpc("datastore", "get_datastore")
    REPLY = DatastoreView
    region: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)


class RemoveDatastore(Command):
    TYPE = "gpufleet.datastore.remove_datastore.v1"
    SUBJECT = subjects.rpc("datastore", "remove_datastore")
    REPLY = DatastoreView
    region: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)


class DatastoreAdded(Event):
    """A datastore was added (never its password)."""

    TYPE = "gpufleet.datastore.added.v1"
    SUBJECT = subjects.event("datastore", "added")
    account: str
    region_id: str
    name: str
    type: DatastoreType
    at: datetime


class DatastoreRemoved(Event):
    TYPE = "gpufleet.datastore.removed.v1"
    SUBJECT = subjects.event("datastore", "removed")
    account: str
    region_id: str
    name: str
    at: datetime


class RegionFacts(BaseModel):
    """What the provisioner knows of one account's region that regional resources depend on
    (R-RES-1, R-TEN-3)."""

    model_config = ConfigDict(frozen=True)

    region_id: str  # `<owner>/<region>`
    compute_nodes: int  # not removed (devices are device-fleet's: CountRegionDevices)
    plan: str
    # what devices need of it (R-DEV-1, R-NODE-3)
    provider: str = "physical"
    storage_mode: str | None = None
    storage_node_active: bool = False


class GetRegionFacts(Command):
    """A service's question to the provisioner about `owner`'s region `region` (NotFound if
    the owner has no such region). The datastore and device-fleet services ask
    (svc.provisioner.*)."""

    READ = True

    TYPE = "gpufleet.provider.region_facts.v1"
    SUBJECT = subjects.service_call("provisioner", "region_facts")
    REPLY = RegionFacts
    owner: str = Field(pattern=subjects.ACCOUNT_RE.pattern)
    region: Name = Field(min_length=1, max_length=limits.NAME_CHARS)


class NodeFacts(BaseModel):
    """Who a node is, as the provisioner enrolled it: its owner and region, and the public
    key its secrets are sealed to (None: it sent none)."""

    model_config = ConfigDict(frozen=True)

    minion_id: str
    owner: str
    region: str
    sealing_key: str | None = None


class GetNodeFacts(Command):
    """A service's question to the provisioner about one node (NotFound if there is none,
    or it was removed). Only the datastore service asks (svc.provisioner.*)."""

    READ = True

    TYPE = "gpufleet.node.node_facts.v1"
    SUBJECT = subjects.service_call("provisioner", "node_facts")
    REPLY = NodeFacts
    minion_id: Name = Field(min_length=1, max_length=limits.NAME_CHARS)


class SealedPassword(BaseModel):
    """An SMB password sealed to one node's key (gpufleet_auth.sealing): only it opens it."""

    model_config = ConfigDict(frozen=True)

    key_id: str = Field(max_length=64)
    box: str = Field(max_length=2048, repr=False)  # base64


class DatastoreMount(BaseModel):
    """What a node needs to mount a datastore of its region: the server, the root, the
    options, and for SMB the user and the password sealed to that node."""

    model_config = ConfigDict(frozen=True)

    name: str
    region_id: str
    type: DatastoreType
    address: str
    root_path: str
    mount_options: list[str] = Field(default_factory=list)
    username: str | None = None
    password: SealedPassword | None = None


class MountDatastore(Command):
    """A node agent's request for a datastore of its own region and owner (the datastore
    service reads the node from the subject, which only its credential may publish, and
    asks the provisioner who the node is): another owner's or region's is "not found"."""

    TYPE = "gpufleet.datastore.mount_datastore.v1"
    SUBJECT = subjects.node_request("datastore", "mount_datastore")
    REPLY = DatastoreMount
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
