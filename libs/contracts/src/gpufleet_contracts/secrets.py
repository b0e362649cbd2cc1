"""What the product treats as a secret, and how one is left out of what others may read.

Secrets (a job's environment values, R-JOB-7; a GCP service-account key, R-PROV-2; a join
token's secret) are encrypted at rest and never appear in events, logs, replies or
dead-letter records. Where a message must still say that a secret is there (a job's spec in
`JobQueued`, a job as `get_job` shows it), its value is replaced by `REDACTED`; the names stay.
"""

from __future__ import annotations

import json
from typing import Any

REDACTED = "<secret>"

# Fields whose value is a secret wherever they occur in a message body. `env` is a mapping
# of names to secret values (a job's environment: all of it, it is where users put tokens).
SECRET_FIELDS = frozenset(
    {"key_json", "secret", "private_key", "password", "token", "seed", "credentials"}
)
ENV_FIELDS = frozenset({"env"})


def redact_env(env: dict[str, Any]) -> dict[str, str]:
    """An environment with its names and every value replaced by REDACTED."""
    return dict.fromkeys(env, REDACTED)


def redact(value: Any) -> tuple[Any, bool]:
    """`value` (decoded JSON) with every secret replaced by REDACTED, and whether any was."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        found = False
        for k, v in value.items():
            if k in ENV_FIELDS and isinstance(v, dict):
                out[k] = redact_env(v)
                found = found or bool(v)
            elif k in SECRET_FIELDS and v not in (None, ""):
                out[k] = REDACTED
                found = True
            else:
                out[k], hit = redact(v)
                found = found or hit
        return out, found
    if isinstance(value, list):
        items = [redact(v) for v in value]
        return [v for v, _ in items], any(hit for _, hit in items)
    return value, False


def redact_json(raw: bytes) -> bytes:
    """A JSON message body with its secrets replaced by REDACTED; the same bytes when it has
    none (or is not JSON: then nothing in it is known to be a secret)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw
    cleaned, found = redact(data)
    return json.dumps(cleaned).encode() if found else raw
