"""The identities of a local stack (`just up`, the e2e tests): every process its own.

Each service gets its own credential (`GPUFLEET_NATS_CREDS`), the provisioner also the
signing keys (`GPUFLEET_AUTH_DIR`); the local account `local` is created on plan `team`
with one user, `dev`, whose credential the CLI uses; the node agent enrols with a join
token, as a real node would.

The provisioner and the scheduler share one Fernet key (`GPUFLEET_SECRET_KEY`) that seals the
secrets they store (a GCP key, a job's env values): the stack's, `<auth dir>/secret.key`
(0600, made on first use).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
from gpufleet_auth.creds import write_secret
from gpufleet_contracts import Envelope, subjects

from .nats import NatsServer
from .processes import DevstackError

LOCAL_ACCOUNT = "local"
LOCAL_USER = "dev"
LOCAL_REGION = "local"
SECRET_KEY_SERVICES = frozenset({"provisioner", "scheduler", "datastore"})  # they store secrets


def secret_key(server: NatsServer, adopt: Path | None = None) -> str:
    """The stack's Fernet key, made on first use (or taken from `adopt`, a key file of an
    earlier layout, so what it sealed stays readable)."""
    path = server.auth_dir / "secret.key"
    if not path.exists():
        from cryptography.fernet import Fernet

        if adopt is not None and adopt.exists():
            key = adopt.read_text().strip()
        else:
            key = Fernet.generate_key().decode()
        write_secret(path, key + "\n")
    return path.read_text().strip()


def service_env(server: NatsServer, service: str) -> dict[str, str]:
    """A service's (or the node agent's: none) identity settings."""
    if service in ("node-agent", "device-agent"):  # they enrol (a device with its token)
        return {}
    if service == "gateway":  # the console: it may only redeem sign-in codes
        return {"GPUFLEET_NATS_CREDS": str(server.creds("gateway"))}
    env = {"GPUFLEET_NATS_CREDS": str(server.creds("service", service))}
    if service in SECRET_KEY_SERVICES:
        env["GPUFLEET_SECRET_KEY"] = secret_key(server)
    if service == "provisioner":
        env["GPUFLEET_AUTH_DIR"] = str(server.authority.directory)
    return env


def user_creds(server: NatsServer, account: str = LOCAL_ACCOUNT, user: str = LOCAL_USER) -> Path:
    return server.creds("user", user, account=account)


async def admin_request(
    server: NatsServer, verb: str, body: dict[str, Any], *, timeout_s: float = 180.0
) -> dict[str, Any]:
    """An operator's request to the provisioner, retried until it is up (a loaded 2-core machine
    has taken over 60 s to start it); the reply object."""
    subject = subjects.admin("provisioner", verb)
    headers = Envelope(
        type=f"gpufleet.admin.{verb}.v1", source="gpufleet/devstack", subject=subject
    )
    nc = await nats.connect(server.url, connect_timeout=5, **server.admin())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while True:
            try:
                msg = await nc.request(
                    subject, json.dumps(body).encode(), timeout=5, headers=headers.headers()
                )
                reply: dict[str, Any] = json.loads(msg.data)
                return reply
            except (nats.errors.NoRespondersError, TimeoutError):
                if loop.time() > deadline:
                    raise DevstackError(f"the provisioner did not answer {subject}") from None
                await asyncio.sleep(0.3)
    finally:
        await nc.close()


async def ensure_account(server: NatsServer, account: str, plan: str = "team") -> None:
    reply = await admin_request(server, "create_account", {"account": account, "plan": plan})
    error = reply.get("error") if reply.get("ok") is False else None
    if error and error.get("code") != "conflict":
        raise DevstackError(f"create_account {account}: {error.get('message')}")


async def join_token(
    server: NatsServer, minion_id: str, account: str = LOCAL_ACCOUNT, region: str = LOCAL_REGION
) -> str:
    body = {"account": account, "minion_id": minion_id, "region": region, "ttl_s": 3600}
    reply = await admin_request(server, "issue_join_token", body)
    if reply.get("ok") is False:
        raise DevstackError(f"join token for {minion_id}: {reply.get('error')}")
    return str(reply["token"])


async def prepare_node(
    server: NatsServer, minion_id: str, state_dir: Path, account: str = LOCAL_ACCOUNT
) -> dict[str, str]:
    """The node agent's enrolment settings: a join token unless it already enrolled."""
    await ensure_account(server, account)
    if (state_dir / "node.creds").exists():
        return {}
    return {"GPUFLEET_JOIN_TOKEN": await join_token(server, minion_id, account)}


async def apply_streams(server: NatsServer, replicas: int = 1) -> None:
    """As an operator: create or update gpufleet's streams to this release's configuration
    (services may create a missing stream, never change one)."""
    from gpufleet_bus.streams import ensure_streams

    nc = await nats.connect(server.url, connect_timeout=5, **server.admin())
    try:
        await ensure_streams(nc.jetstream(), replicas, update=True)
    finally:
        await nc.close()
