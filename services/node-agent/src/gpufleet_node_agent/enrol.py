"""Enrolment: a join token exchanged once for this node's own credential (R-NODE-2).

The node makes its key pair here and sends only the public key; the provisioner answers with
a JWT bound to that key, this minion id, the token's account and region. The credential is
written 0600 into the agent's state directory and used from then on; the token is spent.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import nats
from gpufleet_auth import Creds, new_user_key, public
from gpufleet_auth.tokens import JoinToken, JoinTokenError
from gpufleet_bus import StartError
from gpufleet_contracts import Envelope, ErrorReply, subjects
from gpufleet_contracts.identity import EnrollNode, NodeEnrolled

log = logging.getLogger("gpufleet.node_agent.enrol")


class EnrolmentError(StartError):
    """The token was refused (unknown, spent, expired, another minion's): not retried; the
    agent prints it and exits with status 2 (gpufleet_bus.run_service)."""


def read_token(token: str) -> JoinToken:
    try:
        return JoinToken.parse(token)
    except JoinTokenError as exc:
        raise EnrolmentError(f"GPUFLEET_JOIN_TOKEN: {exc}") from exc


async def enrol(
    servers: list[str],
    token: str,
    minion_id: str,
    creds_path: Path,
    *,
    attempts: int = 60,
    tls: dict[str, object] | None = None,
) -> NodeEnrolled:
    parsed = read_token(token)
    enrol_creds, secret, token_minion = parsed.creds, parsed.secret, parsed.minion_id
    if token_minion != minion_id:
        raise EnrolmentError(
            f"this join token enrols minion {token_minion!r}, not {minion_id!r} "
            "(set GPUFLEET_MINION_ID to match)"
        )
    if not enrol_creds.inbox_prefix.startswith(f"{subjects.enroll_inbox(minion_id)}."):
        # the provisioner answers an enrolment only on the token's enrolment inbox
        raise EnrolmentError(
            "this join token was issued by an older provisioner and cannot be answered: "
            "issue a new one (`gpufleet node token`)"
        )
    key = new_user_key()
    cmd = EnrollNode(minion_id=minion_id, secret=secret, public_key=public(key))
    subject = subjects.enroll(minion_id)
    headers = Envelope(type=cmd.TYPE, source="gpufleet/node-agent", subject=subject).headers()
    delay = 0.5
    for attempt in range(1, attempts + 1):
        try:
            nc = await nats.connect(
                servers,
                name=f"gpufleet-enrol-{minion_id}",
                allow_reconnect=False,
                **enrol_creds.connect_options(),
                **(tls or {}),
            )
            try:
                reply = await nc.request(subject, cmd.to_bytes(), timeout=10, headers=headers)
            finally:
                await nc.close()
        except (nats.errors.NoRespondersError, TimeoutError, OSError, nats.errors.Error) as exc:
            if attempt == attempts:
                raise
            log.warning("enrolment not answered (%s), retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
            continue
        data = json.loads(reply.data)
        if data.get("ok") is False:
            raise EnrolmentError(ErrorReply.model_validate(data).error.message)
        enrolled = NodeEnrolled.model_validate(data)
        Creds(jwt=enrolled.jwt, seed=key.seed.decode()).write(creds_path)
        log.info(
            "enrolled %s for account %s in region %s; credential in %s",
            minion_id,
            enrolled.account,
            enrolled.region,
            creds_path,
        )
        return enrolled
    raise EnrolmentError("unreachable")
