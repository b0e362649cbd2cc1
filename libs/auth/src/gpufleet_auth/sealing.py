"""Secrets for one node alone: the node's X25519 key pair and libsodium's sealed box.

A node makes its key pair at its first start (`SealingKey.load`: the private key, 0600 in
its state directory, beside its credential) and sends the public half with every
RegisterNode. Whoever must send it a secret seals it to that public key (`seal`: a fresh
ephemeral key, one X25519 agreement, XSalsa20-Poly1305); only the node opens it
(`SealingKey.open`). What lies in between (the bus, a stream, an operator's subscription, a
dead letter) holds a box that says nothing but its length.

A box names the key it was sealed to (`key_id`, a hash of the public key), so a node whose
key was replaced can tell a box sealed to its earlier key (`EarlierKey`) from one that was
tampered with (`SealError`).

The node vouches for its public key with its credential's nkey (`vouch`: an Ed25519
signature), and the provisioner keeps a key only when the nkey it enrolled signed it
(`vouched`): a credential that may publish the node's RegisterNode but does not hold the
node's seed (an operator's) cannot have the node's secrets sealed to a key of its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import nacl.exceptions
from nacl.public import PrivateKey, PublicKey, SealedBox

from .creds import key_from_seed, write_secret
from .jwt import verify_key

KEY_BYTES = 32
# The public key as RegisterNode carries it: standard base64 of its 32 bytes.
PUBLIC_KEY_PATTERN = r"^[A-Za-z0-9+/]{43}=$"
KEY_ID_PREFIX = "x25519:"
# What a node's nkey signs to vouch for its sealing key (never a NATS nonce or a JWT).
VOUCHED = b"gpufleet.v1.sealing-key:"


class SealError(Exception):
    """A box that does not open with this key (tampered with, or not a box). Its message
    never holds what the box holds."""


class EarlierKey(SealError):
    """A box sealed to another key of this node's (its key was replaced since)."""


def key_id(public_key: str) -> str:
    """`x25519:<16 hex>`: which key a box was sealed to (a hash of the public key)."""
    return KEY_ID_PREFIX + hashlib.sha256(_raw(public_key)).hexdigest()[:16]


def _raw(public_key: str) -> bytes:
    try:
        raw = base64.b64decode(public_key, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("a sealing key is the base64 of 32 bytes") from exc
    if len(raw) != KEY_BYTES:
        raise ValueError("a sealing key is the base64 of 32 bytes")
    return raw


def seal(public_key: str, data: bytes) -> str:
    """`data` sealed to `public_key`, as base64 (48 bytes longer than `data`, then base64).
    ValueError: not a key anything can be sealed to."""
    try:
        box = SealedBox(PublicKey(_raw(public_key))).encrypt(data)
    except nacl.exceptions.CryptoError as exc:  # e.g. a low-order point: no shared secret
        raise ValueError("nothing can be sealed to this sealing key") from exc
    return base64.b64encode(box).decode()


def usable(public_key: str | None) -> bool:
    """Whether secrets can be sealed to `public_key` (a well-formed key that is not one of
    the few points X25519 refuses)."""
    if public_key is None:
        return False
    try:
        seal(public_key, b"")
    except ValueError:
        return False
    return True


def vouch(seed: str, public_key: str) -> str:
    """The node's nkey (`seed`, its credential's) vouching for its sealing key: base64."""
    return base64.b64encode(key_from_seed(seed).sign(VOUCHED + public_key.encode())).decode()


def vouched(nkey: str, public_key: str, signature: str | None) -> bool:
    """Whether the public nkey `nkey` (a node's, as enrolled) signed `public_key`."""
    if not signature:
        return False
    try:
        verify_key(nkey).verify(VOUCHED + public_key.encode(), base64.b64decode(signature))
    except (nacl.exceptions.CryptoError, ValueError, binascii.Error):  # a bad signature too
        return False
    return True


@dataclass(frozen=True)
class SealingKey:
    """A node's private sealing key (never shown: no repr of it)."""

    private: PrivateKey = field(repr=False)

    @classmethod
    def generate(cls) -> SealingKey:
        return cls(PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> SealingKey:
        """The key kept at `path`; made (and written 0600) when there is none yet."""
        path = path.expanduser()
        if not path.exists():
            key = cls.generate()
            write_secret(path, base64.b64encode(bytes(key.private)).decode() + "\n")
            return key
        try:
            raw = base64.b64decode(path.read_text().strip(), validate=True)
            return cls(PrivateKey(raw))
        except (binascii.Error, ValueError, nacl.exceptions.CryptoError) as exc:
            raise ValueError(f"{path} does not hold a sealing key (base64 of 32 bytes)") from exc

    @property
    def public_key(self) -> str:
        return base64.b64encode(bytes(self.private.public_key)).decode()

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def open(self, box: str, sealed_to: str) -> bytes:
        """What `box` (base64) holds. EarlierKey: it was sealed to another key (`sealed_to`,
        its key id, is not this one's); SealError: it does not open."""
        if sealed_to != self.key_id:
            raise EarlierKey(f"sealed to {sealed_to[:40]}, this node's key is {self.key_id}")
        try:
            return SealedBox(self.private).decrypt(base64.b64decode(box, validate=True))
        except (binascii.Error, ValueError, nacl.exceptions.CryptoError) as exc:
            raise SealError("the sealed box does not open with this node's key") from exc
