"""Attack class 1: connecting without a credential the installation issued."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import nkeys
import pytest
from gpufleet_auth import Creds, jwt, permissions
from gpufleet_auth.creds import inbox_prefix, new_key, new_user_key, public

from .attack import connect_refused
from .conftest import ATTACKER_ACCOUNT, VICTIM_ACCOUNT, System, Victim


def _user_claims(account: str, key: nkeys.KeyPair, system: System) -> dict[str, object]:
    grant = permissions.for_user(account, inbox_prefix(public(key)))
    return {
        "type": "user",
        **grant.nats_claims(),
        "issuer_account": system.nats.authority.account,
        "tags": ["user", f"account:{account}"],
    }


async def test_anonymous_connection_is_refused(system: System, victim: Victim) -> None:
    """No credential at all: the server does not let the connection in."""
    said = await connect_refused(system.nats.url, None)
    assert "authorization violation" in said
    await victim.assert_untouched()


async def test_a_jwt_signed_by_a_key_that_is_not_the_accounts_is_refused(
    system: System, victim: Victim
) -> None:
    """A forged user JWT: well formed, claims the real account, signed by a fresh account
    key the operator never vouched for (and granting everything)."""
    key = new_user_key()
    forger = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    claims = _user_claims(VICTIM_ACCOUNT, key, system)
    claims.update(pub={"allow": [">"]}, sub={"allow": [">"]})
    token = jwt.encode(forger, public(key), "user:forged", claims)
    await connect_refused(system.nats.url, Creds(jwt=token, seed=key.seed.decode()))
    await victim.assert_untouched()


async def test_a_jwt_whose_claims_were_edited_after_signing_is_refused(
    system: System, victim: Victim, eve: Path
) -> None:
    """A real user JWT with its permissions widened to everything, signature unchanged."""
    real = Creds.read(eve)
    head, body, signature = real.jwt.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["nats"]["pub"] = {"allow": [">"]}
    claims["nats"]["sub"] = {"allow": [">"]}
    edited = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    tampered = Creds(jwt=f"{head}.{edited}.{signature}", seed=real.seed)
    await connect_refused(system.nats.url, tampered)
    await victim.assert_untouched()


async def test_an_expired_jwt_is_refused(system: System, victim: Victim) -> None:
    """A credential the installation did issue, but whose time is over."""
    key = new_user_key()
    issuer = system.nats.authority.issuer
    token = issuer.user_jwt(
        public(key),
        f"user:{ATTACKER_ACCOUNT}:expired",
        permissions.for_user(ATTACKER_ACCOUNT, inbox_prefix(public(key))),
        expires=int(time.time()) - 60,
    )
    await connect_refused(system.nats.url, Creds(jwt=token, seed=key.seed.decode()))
    await victim.assert_untouched()


async def test_a_stolen_jwt_without_its_seed_is_refused(
    system: System, victim: Victim, victim_user: Path
) -> None:
    """The victim's JWT (public: it travels in every CONNECT) with the attacker's own key:
    the server's nonce is signed by the wrong key."""
    stolen = Creds.read(victim_user)
    await connect_refused(system.nats.url, Creds(jwt=stolen.jwt, seed=new_user_key().seed.decode()))
    await victim.assert_untouched()


@pytest.mark.parametrize(
    "token",
    ["garbage", "a.b.c", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."],
    ids=["not-a-jwt", "three-dots", "alg-none"],
)
async def test_a_garbage_jwt_is_refused(system: System, victim: Victim, token: str) -> None:
    """Whatever is sent as the JWT, if it is not one the account signed, no connection."""
    await connect_refused(system.nats.url, Creds(jwt=token, seed=new_user_key().seed.decode()))
    await victim.assert_untouched()
