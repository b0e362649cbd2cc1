"""The chain of trust: operator -> accounts -> users (NATS decentralized JWT auth).

One NATS account, `GPUFLEET`, holds every gpufleet identity: services, node agents, users
and operators. Tenants are not NATS accounts: a tenant account is a subject token, and each
user JWT allows only its own (permissions.py). One NATS account keeps the streams and the
services in one place with no imports and exports to keep in step, while the server still
refuses any subject a credential was not given. The system account `SYS` exists for the
server's own use and for pushing account updates (revocations).

Keys (seeds, 0600 files in the authority's directory):
- `operator.nk` signs the operator JWT only (keep it offline in production);
- `operator-signing.nk` signs account JWTs: needed to revoke a credential;
- `account.nk` / `system.nk` are the accounts' identities (they sign nothing here);
- `account-signing.nk` signs every gpufleet user JWT: needed to issue credentials;
- `system-signing.nk` signs the system account's users.
The provisioner, which enrols nodes and revokes them, gets `operator-signing.nk`,
`account-signing.nk` and the public keys (`Issuer.load`); no other service gets a seed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from gpufleet_contracts import subjects

from . import jwt, permissions
from .creds import (
    Creds,
    inbox_prefix,
    key_from_seed,
    new_key,
    new_user_key,
    public,
    seed_of,
    write_secret,
)
from .permissions import Grant

OPERATOR_NAME = "gpufleet"
ACCOUNT_NAME = "GPUFLEET"
SYSTEM_NAME = "SYS"

# JetStream on, no other limit: the account is the whole installation.
ACCOUNT_LIMITS: dict[str, Any] = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
}
SYSTEM_LIMITS: dict[str, Any] = {
    k: v
    for k, v in ACCOUNT_LIMITS.items()
    if k not in {"mem_storage", "disk_storage", "streams", "consumer"}
}
# The longest protocol line the server accepts: a CONNECT carries the user JWT, and the
# scheduler's (its permissions) is about 4.6 KB, over nats-server's default of 4 KiB.
MAX_CONTROL_LINE = 32768
# Every user JWT: the account's limits apply, none of its own.
USER_LIMITS: dict[str, Any] = {"subs": -1, "data": -1, "payload": -1}

_FILES = (
    "operator.nk",
    "operator-signing.nk",
    "account.nk",
    "account-signing.nk",
    "system.nk",
    "system-signing.nk",
)


def _read_key(path: Path) -> nkeys.KeyPair:
    return key_from_seed(path.read_text().strip())


@dataclass(frozen=True)
class Issuer:
    """What issuing and revoking credentials takes: the signing keys and public ids."""

    operator_signing: nkeys.KeyPair
    account_signing: nkeys.KeyPair
    account: str  # public key of GPUFLEET
    system_signing: nkeys.KeyPair | None = None
    system: str | None = None

    @classmethod
    def load(cls, directory: Path | str) -> Issuer:
        d = Path(directory).expanduser()
        ids = json.loads((d / "public.json").read_text())
        system_seed = d / "system-signing.nk"
        return cls(
            operator_signing=_read_key(d / "operator-signing.nk"),
            account_signing=_read_key(d / "account-signing.nk"),
            account=ids["account"],
            system_signing=_read_key(system_seed) if system_seed.exists() else None,
            system=ids.get("system"),
        )

    # --- account JWTs ---------------------------------------------------------------

    def account_jwt(
        self, revocations: dict[str, int] | None = None, *, issued_at: int | None = None
    ) -> str:
        """GPUFLEET's JWT; `revocations` maps a user's public key to the time (unix s) before
        which every JWT issued to it is void (the server cuts such connections at once)."""
        nats: dict[str, Any] = {
            "type": "account",
            "limits": ACCOUNT_LIMITS,
            "signing_keys": [public(self.account_signing)],
            "default_permissions": {"pub": {}, "sub": {}},
        }
        if revocations:
            nats["revocations"] = dict(sorted(revocations.items()))
        return jwt.encode(
            self.operator_signing, self.account, ACCOUNT_NAME, nats, issued_at=issued_at
        )

    # --- user JWTs ------------------------------------------------------------------

    def user_jwt(
        self,
        user_public: str,
        name: str,
        grant: Grant,
        *,
        expires: int | None = None,
        tags: tuple[str, ...] = (),
    ) -> str:
        """`tags` tell a client who it is (`account:acme`, `operator`); they grant nothing:
        the server enforces the permissions."""
        nats = {
            "type": "user",
            **USER_LIMITS,
            **grant.nats_claims(),
            "issuer_account": self.account,
            "tags": [grant.kind, *tags],
        }
        return jwt.encode(self.account_signing, user_public, name, nats, expires=expires)

    def creds(
        self,
        name: str,
        grant_for: Any,
        *,
        expires: int | None = None,
        tags: tuple[str, ...] = (),
        inboxes: str = subjects.INBOX,
    ) -> Creds:
        """A new key pair and its JWT; `grant_for(inbox)` gives the identity's grant, its
        inbox being `<inboxes>.<public key>` (the scope the services answer it in)."""
        key = new_user_key()
        grant: Grant = grant_for(inbox_prefix(public(key), inboxes))
        token = self.user_jwt(public(key), name, grant, expires=expires, tags=tags)
        return Creds(jwt=token, seed=seed_of(key))

    def service(self, name: str) -> Creds:
        return self.creds(f"service:{name}", lambda inbox: permissions.for_service(name, inbox))

    def user(self, account: str, user: str, *, expires: int | None = None) -> Creds:
        return self.creds(
            f"user:{account}:{user}",
            lambda inbox: permissions.for_user(account, inbox),
            expires=expires,
            tags=(f"account:{account}", f"user:{user}"),
            inboxes=subjects.account_inbox(account),
        )

    def operator(self, name: str = "admin", *, expires: int | None = None) -> Creds:
        return self.creds(f"operator:{name}", permissions.for_operator, expires=expires)

    def gateway(self, name: str = "console") -> Creds:
        """The web console gateway's own identity: it may only redeem sign-in codes."""
        return self.creds(f"gateway:{name}", permissions.for_gateway)

    def enroll(self, minion_id: str, ttl_s: int) -> Creds:
        return self.creds(
            f"enroll:{minion_id}",
            lambda inbox: permissions.for_enroll(minion_id, inbox),
            expires=int(time.time()) + ttl_s,
            inboxes=subjects.enroll_inbox(minion_id),
        )

    def node(self, minion_id: str, node_public: str, *, account: str, region: str) -> str:
        """The JWT of a node agent's own key (the agent keeps its seed; only this travels)."""
        grant = permissions.for_node(
            minion_id, inbox_prefix(node_public, subjects.node_inbox(minion_id))
        )
        return self.user_jwt(
            node_public,
            f"node:{account}:{region}:{minion_id}",
            grant,
            tags=(f"account:{account}", f"region:{region}", f"minion:{minion_id}"),
        )

    def device(self, minion_id: str, device_public: str, *, account: str, region: str) -> str:
        """The JWT of an edge device agent's own key: its device's subjects only."""
        grant = permissions.for_device(
            minion_id, inbox_prefix(device_public, subjects.node_inbox(minion_id))
        )
        return self.user_jwt(
            device_public,
            f"device:{account}:{region}:{minion_id}",
            grant,
            tags=(f"account:{account}", f"region:{region}", f"minion:{minion_id}"),
        )

    def claims_pusher(self) -> Creds:
        """A system-account user allowed only to push account JWTs."""
        if self.system_signing is None or self.system is None:
            raise RuntimeError("this issuer has no system account signing key")
        key = new_user_key()
        grant = permissions.CLAIMS_PUSHER.bind(inbox=inbox_prefix(public(key)))
        nats = {"type": "user", **USER_LIMITS, **grant.nats_claims(), "issuer_account": self.system}
        token = jwt.encode(self.system_signing, public(key), "system:claims", nats)
        return Creds(jwt=token, seed=seed_of(key))


@dataclass(frozen=True)
class Authority:
    """Every key of one installation, kept in `directory` (created by `just up`, tests)."""

    directory: Path
    operator: nkeys.KeyPair
    issuer: Issuer
    system: nkeys.KeyPair
    created: int  # unix s: the preloaded account JWTs carry it, so a pushed one is newer

    @classmethod
    def load_or_create(cls, directory: Path | str) -> Authority:
        d = Path(directory).expanduser().absolute()
        if not all((d / f).exists() for f in _FILES):
            d.mkdir(parents=True, exist_ok=True)
            seeds = {
                "operator.nk": new_key(nkeys.PREFIX_BYTE_OPERATOR),
                "operator-signing.nk": new_key(nkeys.PREFIX_BYTE_OPERATOR),
                "account.nk": new_key(nkeys.PREFIX_BYTE_ACCOUNT),
                "account-signing.nk": new_key(nkeys.PREFIX_BYTE_ACCOUNT),
                "system.nk": new_key(nkeys.PREFIX_BYTE_ACCOUNT),
                "system-signing.nk": new_key(nkeys.PREFIX_BYTE_ACCOUNT),
            }
            for name, key in seeds.items():
                write_secret(d / name, seed_of(key) + "\n")
            ids = {
                "created": int(time.time()),
                "operator": public(seeds["operator.nk"]),
                "account": public(seeds["account.nk"]),
                "system": public(seeds["system.nk"]),
            }
            (d / "public.json").write_text(json.dumps(ids, indent=2) + "\n")
        return cls(
            directory=d,
            operator=_read_key(d / "operator.nk"),
            issuer=Issuer.load(d),
            system=_read_key(d / "system.nk"),
            created=int(json.loads((d / "public.json").read_text())["created"]),
        )

    @property
    def account(self) -> str:
        return self.issuer.account

    @property
    def system_account(self) -> str:
        return public(self.system)

    def operator_jwt(self) -> str:
        nats = {
            "type": "operator",
            "signing_keys": [public(self.issuer.operator_signing)],
            "system_account": self.system_account,
        }
        return jwt.encode(
            self.operator, public(self.operator), OPERATOR_NAME, nats, issued_at=self.created
        )

    def system_jwt(self) -> str:
        signing = self.issuer.system_signing
        nats = {
            "type": "account",
            "limits": SYSTEM_LIMITS,
            "signing_keys": [public(signing)] if signing else [],
        }
        return jwt.encode(
            self.issuer.operator_signing,
            self.system_account,
            SYSTEM_NAME,
            nats,
            issued_at=self.created,
        )

    def server_config(self, resolver_dir: Path) -> str:
        """The nats-server configuration block that turns decentralized auth on.

        The `full` resolver keeps the newest account JWT it was given in `resolver_dir`
        (a pushed revocation survives a restart); the preload seeds it on first start.
        A client sends its user JWT in its CONNECT line, and a service's JWT (its permission
        list) is longer than nats-server's default 4 KiB control line: MAX_CONTROL_LINE.
        """
        operator_file = self.directory / "operator.jwt"
        operator_file.write_text(self.operator_jwt() + "\n")
        return (
            f'operator: "{operator_file}"\n'
            f"system_account: {self.system_account}\n"
            f"max_control_line: {MAX_CONTROL_LINE}\n"
            "resolver: {\n"
            "  type: full\n"
            f'  dir: "{resolver_dir}"\n'
            "  allow_delete: false\n"
            '  interval: "2m"\n'
            "}\n"
            "resolver_preload: {\n"
            f"  {self.system_account}: {self.system_jwt()}\n"
            f"  {self.account}: {self.issuer.account_jwt(issued_at=self.created)}\n"
            "}\n"
        )
