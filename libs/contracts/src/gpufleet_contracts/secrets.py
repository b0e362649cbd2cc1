"""What the product treats as a secret, and how one is left out of what others may read.

Secrets (a job's environment values, R-JOB-7; a GCP service-account key, R-PROV-2; a join
token's secret) are encrypted at rest and never appear in events, logs, replies or
dead-letter records. Where a message must still say that a secret is there (a job's spec in
`JobQueued`, a job as `get_job` shows it), its value is replaced by `REDACTED`; the names stay.
Dead-letter records are redacted by `gpufleet_bus.redact` with the same marker.
"""

from __future__ import annotations

from typing import Any

REDACTED = "<secret>"


def redact_env(env: dict[str, Any]) -> dict[str, str]:
    """An environment with its names and every value replaced by REDACTED."""
    return dict.fromkeys(env, REDACTED)
