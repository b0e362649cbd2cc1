"""`just up --gcp`: once the provisioner answers, enable the emulated GCP provider (an
emulated service-account key) and its region for the local account."""

from __future__ import annotations

from typing import Final

from gpufleet_contracts import subjects

from gpufleet_devstack import identities
from gpufleet_devstack.processes import DevstackError
from gpufleet_devstack.stack import Stack

GCP_PROJECT: Final = "gpufleet-dev"
GCP_REGION: Final = "us-central1"


async def enable_emulated_gcp(stack: Stack) -> list[str]:
    """Enable the gcp provider (an emulated service-account key) and its region, once."""
    import json

    import nats
    from gpufleet_gcp_emulator.testing import service_account_key

    key = service_account_key(GCP_PROJECT)
    said: list[str] = []
    nc = await nats.connect(
        stack.nats.url, connect_timeout=5, **stack.nats.client(identities.user_creds(stack.nats))
    )
    try:
        for verb, body in (
            ("enable_provider", {"provider": "gcp", "key_json": json.dumps(key)}),
            ("create_region", {"provider": "gcp", "name": GCP_REGION}),
        ):
            reply = json.loads(
                (
                    await nc.request(
                        subjects.as_account(
                            subjects.rpc("provisioner", verb), identities.LOCAL_ACCOUNT
                        ),
                        json.dumps(body).encode(),
                        timeout=30,
                    )
                ).data
            )
            error = reply.get("error") if reply.get("ok") is False else None
            if error and error.get("code") != "conflict":
                raise DevstackError(f"{verb}: {error.get('message')}")
            said.append(f"{verb}: {'already done' if error else 'ok'}")
    finally:
        await nc.close()
    return said
