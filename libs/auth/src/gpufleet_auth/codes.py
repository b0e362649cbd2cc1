"""One-time codes that open what is kept under them (a console sign-in's credential).

The store keeps a code's hash (`code_id`) and a box that only the code opens (`seal_under`:
XSalsa20-Poly1305 under a key derived from the code, not from its hash): whoever reads the
database learns neither the code nor what it was given for.
"""

from __future__ import annotations

import base64
import hashlib
import secrets

import nacl.exceptions
from nacl.secret import SecretBox

from .sealing import SealError

CODE_BYTES = 32
_PERSON = b"gpufleet-code"  # the key's derivation, never the id's


def new_code() -> str:
    """A fresh code: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(CODE_BYTES)


def code_id(code: str) -> str:
    """What the store keys a code by: its SHA-256, hex."""
    return hashlib.sha256(code.encode()).hexdigest()


def _box(code: str) -> SecretBox:
    key = hashlib.blake2b(code.encode(), digest_size=SecretBox.KEY_SIZE, person=_PERSON).digest()
    return SecretBox(key)


def seal_under(code: str, text: str) -> str:
    """`text` in a box that only `code` opens (base64)."""
    return base64.b64encode(bytes(_box(code).encrypt(text.encode()))).decode()


def open_under(code: str, box: str) -> str:
    """What `seal_under(code, ...)` sealed; SealError for any other code or a damaged box."""
    try:
        return _box(code).decrypt(base64.b64decode(box)).decode()
    except (nacl.exceptions.CryptoError, ValueError):
        raise SealError("this box does not open with this code") from None
