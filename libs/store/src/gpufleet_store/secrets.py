"""Secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256) with a key from configuration.

A service that stores secrets (the scheduler: a job's environment values, R-JOB-7) keeps them
only as Fernet tokens made with its `GPUFLEET_SECRET_KEY`, and gives the box to its `Store`,
so that an outbox message that carries a secret (`Transaction.emit(..., sealed=True)`: the
scheduler's StartWorker) is stored sealed too and opened only by the relay, just before it
is published. The provisioner seals the GCP service-account key the same way
(gpufleet_provisioner.keys).

Generate a key with
`python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`.
"""

from __future__ import annotations

import base64
import hmac
import json
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

_PROCESS_KEY: bytes | None = None


class SecretError(RuntimeError):
    """A stored secret that this key cannot open (another key, or a damaged token)."""


class SecretBox:
    """Seals and opens secrets with one Fernet key. Its repr never shows the key."""

    def __init__(self, key: str | bytes) -> None:
        raw = key.encode() if isinstance(key, str) else key
        try:
            self._fernet = Fernet(raw.strip())
        except (ValueError, TypeError):
            raise ValueError(
                "GPUFLEET_SECRET_KEY is not a Fernet key (32 bytes, url-safe base64)"
            ) from None
        # A MAC key of its own, derived from the Fernet key (never the key itself).
        self._mac_key = hmac.digest(base64.urlsafe_b64decode(raw.strip()), b"fingerprint", "sha256")

    @classmethod
    def for_process(cls) -> SecretBox:
        """A key made for this process alone (development and in-process tests): what it
        sealed cannot be opened by another process, nor after a restart."""
        global _PROCESS_KEY
        if _PROCESS_KEY is None:
            _PROCESS_KEY = Fernet.generate_key()
        return cls(_PROCESS_KEY)

    def seal(self, data: bytes) -> bytes:
        return self._fernet.encrypt(data)

    def open(self, token: bytes) -> bytes:
        try:
            return self._fernet.decrypt(token)
        except InvalidToken:
            raise SecretError(
                "a stored secret does not decrypt with this GPUFLEET_SECRET_KEY"
            ) from None

    def seal_json(self, value: Any) -> str:
        """`value` as JSON, sealed: a Fernet token (ASCII text)."""
        return self.seal(json.dumps(value, separators=(",", ":")).encode()).decode()

    def open_json(self, token: str) -> Any:
        return json.loads(self.open(token.encode()))

    def fingerprint(self, data: bytes) -> str:
        """`sha256:<16 hex>`, an HMAC of `data` with a key derived from this one: the same
        value gives the same fingerprint, and without the key a guess cannot be checked."""
        return "sha256:" + hmac.digest(self._mac_key, data, "sha256").hex()[:16]

    def __repr__(self) -> str:
        return "SecretBox(<key>)"
