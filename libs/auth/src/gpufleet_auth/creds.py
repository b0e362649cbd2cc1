"""Nkeys and the `.creds` file: a user JWT plus the seed that proves it is yours.

The format is NATS's own (what `nsc` writes and nats-py's `user_credentials=` reads), so any
NATS client or tool can use a gpufleet credential. A seed is a secret: files are written
0600 and a seed never travels on the bus (a node makes its own and sends the public key).
"""

from __future__ import annotations

import base64
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from gpufleet_contracts import subjects

from . import jwt

_BLOCK = re.compile(r"-{3,}BEGIN [A-Z ]+-{3,}\s*\n(?P<body>\S+)\s*\n-{3,}END [A-Z ]+-{3,}")


def new_key(prefix: int) -> nkeys.KeyPair:
    """A new nkey pair: `nkeys.PREFIX_BYTE_USER`, `..._ACCOUNT` or `..._OPERATOR`."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def new_user_key() -> nkeys.KeyPair:
    return new_key(nkeys.PREFIX_BYTE_USER)


def key_from_seed(seed: str | bytes) -> nkeys.KeyPair:
    return nkeys.from_seed(seed.encode() if isinstance(seed, str) else bytes(seed))


def public(key: nkeys.KeyPair) -> str:
    return str(key.public_key.decode())


def seed_of(key: nkeys.KeyPair) -> str:
    return str(key.seed.decode())


def format_creds(user_jwt: str, seed: str) -> str:
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n"
    )


@dataclass(frozen=True)
class Creds:
    """A parsed `.creds` file."""

    jwt: str
    seed: str

    @property
    def public_key(self) -> str:
        return public(key_from_seed(self.seed))

    @property
    def claims(self) -> dict[str, object]:
        return jwt.decode(self.jwt, verify=False)

    def tag(self, name: str) -> str | None:
        """A tag of the JWT (`account`, `user`, `minion`...): who this credential says it is
        (a convenience for clients; the server enforces the permissions, not the tags)."""
        nats = self.claims.get("nats")
        tags = nats.get("tags", []) if isinstance(nats, dict) else []
        for tag in tags:
            key, _, value = str(tag).partition(":")
            if key == name and value:
                return value
        return None

    @property
    def kind(self) -> str | None:
        """`user`, `operator`, `node`, `service:<name>`, `enroll`: the first tag."""
        nats = self.claims.get("nats")
        tags = nats.get("tags", []) if isinstance(nats, dict) else []
        return str(tags[0]) if tags else None

    @property
    def inbox_prefix(self) -> str:
        """The only inbox this identity may subscribe to, as its JWT grants it (`_INBOX.<scope>
        .<public key>`, gpufleet_contracts.subjects); `_INBOX.<public key>` for one that
        may subscribe anywhere (an operator) or a JWT that is none (the server refuses it)."""
        try:
            nats = self.claims.get("nats")
        except jwt.JwtError:
            nats = None
        sub = nats.get("sub", {}) if isinstance(nats, dict) else {}
        allow = sub.get("allow", []) if isinstance(sub, dict) else []
        for pattern in allow:
            inbox = str(pattern).removesuffix(".>")
            if inbox.startswith(f"{subjects.INBOX}.") and inbox.endswith(f".{self.public_key}"):
                return inbox
        return inbox_prefix(self.public_key)

    def acting_inbox(self, account: str | None) -> str:
        """The inbox prefix of requests made for `account`: the services answer an account's
        requests only under its inboxes (`_INBOX.account.<account>`), so an operator (who
        may subscribe anywhere) acting for it takes its inbox there; anyone else its own."""
        if account and self.kind == "operator":
            return inbox_prefix(self.public_key, subjects.account_inbox(account))
        return self.inbox_prefix

    def text(self) -> str:
        return format_creds(self.jwt, self.seed)

    def connect_options(self, acting_for: str | None = None) -> dict[str, Any]:
        """`nats.connect` keyword arguments for this credential held in memory (no file);
        `acting_for`: the account its requests are made for (`acting_inbox`)."""
        key = key_from_seed(self.seed)
        token = self.jwt.encode()

        def jwt_cb() -> bytes:
            return token

        def sig_cb(nonce: str) -> bytes:
            return base64.b64encode(key.sign(nonce.encode()))

        return {
            "user_jwt_cb": jwt_cb,
            "signature_cb": sig_cb,
            "inbox_prefix": self.acting_inbox(acting_for),
        }

    @classmethod
    def parse(cls, text: str) -> Creds:
        blocks = [m.group("body") for m in _BLOCK.finditer(text)]
        if len(blocks) < 2:
            raise ValueError("not a NATS credentials file (a JWT block and a seed block)")
        return cls(jwt=blocks[0].strip(), seed=blocks[1].strip())

    @classmethod
    def read(cls, path: Path | str) -> Creds:
        return cls.parse(Path(path).expanduser().read_text())

    def write(self, path: Path | str) -> Path:
        return write_secret(Path(path), self.text())


def inbox_prefix(public_key: str, scope: str = subjects.INBOX) -> str:
    """An identity's own inbox: `<scope>.<public key>` (a user's scope is its account's
    inboxes, `subjects.account_inbox`; a service's or an operator's is `_INBOX`)."""
    return f"{scope}.{public_key}"


def write_secret(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable by its owner only (created 0600, never widened)."""
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def connect_options(
    creds: Path | str | None, ca: Path | str | None = None, *, acting_for: str | None = None
) -> dict[str, Any]:
    """`nats.connect` keyword arguments: the credential file, its inbox (the only one it may
    subscribe to; an operator's `acting_for` an account: under that account's), and TLS
    verified against `ca` when given."""
    options: dict[str, Any] = {}
    if creds is not None:
        path = Path(creds).expanduser()
        options["user_credentials"] = str(path)
        options["inbox_prefix"] = Creds.read(path).acting_inbox(acting_for)
    if ca is not None:
        options["tls"] = ssl.create_default_context(cafile=str(Path(ca).expanduser()))
    return options
