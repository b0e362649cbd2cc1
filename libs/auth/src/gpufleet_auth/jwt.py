"""NATS JWTs (decentralized auth, claims version 2), signed with nkeys.

A NATS JWT is a plain JWT whose algorithm is `ed25519-nkey`: the header and the claims are
base64url (no padding) JSON, the signature is the issuer nkey's Ed25519 signature of
`header.claims`. The server checks the chain operator -> account -> user; this module only
writes and reads tokens (`nkeys` does the cryptography). Only the claims gpufleet uses are
modelled; see the NATS documentation "JWTs" for the full schema.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


class JwtError(ValueError):
    """A token that is not a well-formed, correctly signed NATS JWT."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _jti(claims: dict[str, Any]) -> str:
    """The token id: base32 of SHA-512/256 of the claims without it (as NATS's Go library)."""
    digest = hashlib.new("sha512_256", json.dumps(claims, sort_keys=True).encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def encode(
    issuer: nkeys.KeyPair,
    subject: str,
    name: str,
    nats: dict[str, Any],
    *,
    expires: int | None = None,
    issued_at: int | None = None,
) -> str:
    """A signed JWT: `issuer` vouches for `subject` (a public nkey) with these `nats` claims."""
    claims: dict[str, Any] = {
        "iat": issued_at if issued_at is not None else int(time.time()),
        "iss": issuer.public_key.decode(),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    if expires is not None:
        claims["exp"] = expires
    claims["jti"] = _jti(claims)
    head = _b64(json.dumps(HEADER, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = issuer.sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64(signature)}"


def decode(token: str, *, verify: bool = True) -> dict[str, Any]:
    """The claims of `token`; with `verify`, checked against the issuer's public key."""
    try:
        head, body, signature = token.strip().split(".")
        claims: dict[str, Any] = json.loads(_unb64(body))
        header = json.loads(_unb64(head))
    except (ValueError, binascii.Error) as exc:
        raise JwtError("not a JWT") from exc
    if header.get("alg") != HEADER["alg"]:
        raise JwtError(f"algorithm {header.get('alg')!r} is not ed25519-nkey")
    if verify:
        try:
            verify_key(str(claims.get("iss", ""))).verify(
                f"{head}.{body}".encode(), _unb64(signature)
            )
        except (nacl.exceptions.BadSignatureError, ValueError, binascii.Error) as exc:
            raise JwtError("bad signature") from exc
    return claims


def verify_key(public: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key of a public nkey ("U...", "A...", "O..."), its checksum checked."""
    raw = base64.b32decode(public + "=" * (-len(public) % 8))
    if len(raw) != 35 or nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
        raise ValueError(f"{public[:8]}... is not a public nkey")
    return nacl.signing.VerifyKey(raw[1:-2])
