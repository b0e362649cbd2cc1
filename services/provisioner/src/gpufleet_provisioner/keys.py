"""R-PROV-2: the GCP service-account key: validated, its identity extracted, encrypted at rest.

The key is a secret. It is kept only as Fernet ciphertext (the Fernet key comes from
configuration, GPUFLEET_SECRET_KEY), and never logged, echoed in a reply or put in an event:
errors name fields, never values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives.serialization import load_pem_private_key

REQUIRED = ("project_id", "client_email", "private_key")


class KeyError_(ValueError):
    """The key is refused; `problems` name fields and rules, never the key's content."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))
        self.problems = problems


@dataclass(frozen=True)
class ServiceAccountKey:
    project_id: str
    client_email: str
    info: dict[str, Any]  # the whole key; secret

    def __repr__(self) -> str:  # never print the key, even by accident
        return f"ServiceAccountKey(project_id={self.project_id!r}, email={self.client_email!r})"

    __str__ = __repr__


def parse_key(text: str) -> ServiceAccountKey:
    try:
        info = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        raise KeyError_([("key", "not valid JSON")]) from None
    if not isinstance(info, dict):
        raise KeyError_([("key", "must be a JSON object")])
    problems: list[tuple[str, str]] = []
    if info.get("type") != "service_account":
        problems.append(("type", "must be 'service_account'"))
    for name in REQUIRED:
        if not isinstance(info.get(name), str) or not info[name].strip():
            problems.append((name, "is required"))
    pem = info.get("private_key")
    if isinstance(pem, str) and pem.strip():
        try:
            load_pem_private_key(pem.encode(), password=None)
        except (ValueError, TypeError):
            problems.append(("private_key", "is not a PEM private key"))
    email = info.get("client_email")
    if isinstance(email, str) and email and "@" not in email:
        problems.append(("client_email", "is not an e-mail address"))
    if problems:
        raise KeyError_(problems)
    return ServiceAccountKey(str(info["project_id"]), str(info["client_email"]), info)


class SecretBox:
    """Fernet with the configured key. Without one, secrets cannot be stored."""

    def __init__(self, fernet_key: str | None) -> None:
        self._fernet = Fernet(fernet_key.encode()) if fernet_key else None

    @property
    def configured(self) -> bool:
        return self._fernet is not None

    def seal(self, key: ServiceAccountKey) -> str:
        if self._fernet is None:
            raise RuntimeError("GPUFLEET_SECRET_KEY is not set: cannot store a secret")
        return self._fernet.encrypt(json.dumps(key.info).encode()).decode()

    def open(self, token: str) -> ServiceAccountKey:
        if self._fernet is None:
            raise RuntimeError("GPUFLEET_SECRET_KEY is not set: cannot read a stored secret")
        try:
            return parse_key(self._fernet.decrypt(token.encode()).decode())
        except InvalidToken:
            raise RuntimeError("the stored key does not decrypt with GPUFLEET_SECRET_KEY") from None
