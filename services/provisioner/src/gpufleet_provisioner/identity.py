"""Accounts, users, join tokens, node enrolment and revocation (R-TEN-1..3, R-NODE-2).

The provisioner is the one service that holds signing keys (gpufleet_auth.Issuer, from
GPUFLEET_AUTH_DIR): it issues users' and nodes' credentials and revokes them.

- A join token is one-time: its secret is stored hashed, bound to one account, one minion
  id and one region, and expires. It also carries an enrolment-only NATS credential that may
  publish only `gpufleet.v1.enroll.<minion_id>`, so the token cannot be used for anything
  else even before it is spent.
- Enrolment: the node sends the secret and its own public key; the provisioner spends the
  token, makes the node's log stream (what it can store: refused, the token unspent, when
  the JetStream store cannot reserve it) and its command consumer (the node may read it,
  not create it), records the enrolment and answers with a JWT for that key. Which account
  a node belongs to, and its region, come from this record, never from the node's later
  messages.
- A minion id another account holds (enrolled, a node of it, or promised by its unspent
  token) is not revealed to an account asking a join token for it (R-TEN-2): the answer is
  the one a free id gets, a real-looking token (a signed enrolment credential for that id,
  a secret, the asker's region and expiry), but a decoy: it is not a join token the
  provisioner knows (only recorded in `join_token_decoys`, for operators), so its enrolment
  is answered as for any unknown token and the other account's node is never touched. An
  operator asking for an account is told the id is taken.
- Revocation puts the node's key in the account JWT's revocation list and pushes it to the
  servers (they close its connection at once), deletes its consumer and its log stream, and
  records it, so a restarted server or provisioner pushes it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from pathlib import Path

import nats
from faststream.nats import NatsBroker
from gpufleet_auth import Issuer
from gpufleet_auth.tokens import JoinToken
from gpufleet_bus import BusSettings, emit
from gpufleet_bus.streams import (
    NodeLogLimits,
    delete_node_consumer,
    delete_node_logs,
    ensure_node_consumer,
    ensure_node_logs,
    retire_streams,
)
from gpufleet_contracts import subjects
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.devices import DeviceRemoved, IssueDeviceJoinToken
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.identity import (
    AccountChanged,
    AccountRemoved,
    Accounts,
    AccountView,
    AddUser,
    AdminIssueJoinToken,
    CreateAccount,
    EnrollNode,
    IssueJoinToken,
    JoinTokenIssued,
    ListAccounts,
    NodeEnrolled,
    RemoveAccount,
    RemovedAccount,
    RevokeUser,
    SetPlan,
    UserAdded,
    UserRevoked,
)
from gpufleet_store import Doc, Store, Transaction, now_ms
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import APIError
from pymongo import ASCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from .records import invalid
from .removal import Holdings, check_removal, removed

log = logging.getLogger("gpufleet.provisioner.identity")
NO_ROOM = 10047  # JetStream: "insufficient storage resources available"

INDEXES = {
    # Created at start-up (a transaction cannot create a collection); looked up by `_id`.
    "accounts": [],
    "users": [],
    "enrolments": [],
    "revocations": [],
    "join_tokens": [IndexModel([("minion_id", ASCENDING)])],
    "join_token_decoys": [],
}


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Identity:
    def __init__(
        self,
        store: Store,
        issuer: Issuer | None,
        clock: Clock,
        bus: BusSettings,
        broker: NatsBroker | None = None,
        logs: NodeLogLimits | None = None,
        *,
        open_regions: bool = False,
    ) -> None:
        """`broker`: the service's own, whose connection makes and deletes node consumers
        and log streams (none: neither is touched); `logs`: what each node's log stream
        keeps at most; `open_regions` (development, with GPUFLEET_AUTO_ACTIVATE_NODES): a
        join token may name a region that does not exist yet (registration creates it)."""
        self.store = store
        self.db = store.db
        self.issuer = issuer
        self.clock = clock
        self.servers = bus.servers
        self.connect_options = bus.connect_options()
        self.broker = broker
        self.logs = logs or NodeLogLimits()
        self.replicas = bus.stream_replicas
        self.open_regions = open_regions

    async def _js(self) -> JetStreamContext | None:
        return None if self.broker is None else (await self.broker.connect()).jetstream()

    async def start(self) -> None:
        """At start-up: a server that lost the revocations gets them again; every enrolled
        node has its log stream, with this release's limits (the shared stream of earlier
        releases, which held every node's logs, is deleted first)."""
        try:
            await self.push_revocations()
        except Exception:
            log.exception("could not push the revocation list; retried at the next revocation")
        js = await self._js()
        if js is None:
            return
        await retire_streams(js)
        async for doc in self.db.enrolments.find({"state": "active"}, {"_id": 1}):
            try:
                await ensure_node_logs(js, doc["_id"], self.logs, self.replicas, update=True)
            except Exception as exc:  # no room: said here; its enrolment is refused again
                log.error("node %s has no log stream: %s", doc["_id"], exc)

    async def _node_logs(self, js: JetStreamContext, minion_id: str) -> None:
        """The node's log stream, made before it gets a credential: a node that could keep
        no logs would run jobs whose output and ends it can never report."""
        try:
            await ensure_node_logs(js, minion_id, self.logs, self.replicas)
        except APIError as exc:
            if exc.err_code != NO_ROOM:
                raise
            log.error("no room for node %s's log stream: %s", minion_id, exc)
            raise Refused(
                "unavailable",
                f"node {minion_id} cannot be given its log stream: the JetStream store has no "
                f"room to reserve {self.logs.max_bytes} bytes more; an operator raises "
                "max_file_store or lowers GPUFLEET_NODE_LOG_MAX_BYTES, and the same join "
                "token enrols it then",
            ) from exc

    def _issuer(self) -> Issuer:
        if self.issuer is None:
            raise Refused(
                "unavailable",
                "this provisioner holds no signing keys (set GPUFLEET_AUTH_DIR): it cannot "
                "issue or revoke credentials",
            )
        return self.issuer

    # --- accounts and users (operators) ----------------------------------------------

    async def create_account(self, body: CreateAccount) -> AccountView:
        """Operator request: a tenant account with its plan."""
        account, plan = body.account, body.plan
        now = self.clock()

        async def tx_body(tx: Transaction) -> Doc:
            s = tx.session
            known = await self.db.accounts.find_one({"_id": account}, session=s)
            if removed(known):
                raise Refused.of_field(
                    "conflict",
                    f"account {account!r} was removed; its name is not given out again",
                    field="account",
                    rule="R-TEN-1",
                    says="the name of a removed account (its jobs and ledger keep it)",
                    valid="another name",
                )
            if known:
                raise Refused("conflict", f"account {account!r} already exists")
            doc: Doc = {
                "_id": account,
                "plan": plan.value,
                "created_at_ms": now_ms(now),
            }
            await self.db.accounts.insert_one(doc, session=s)
            emit(tx, AccountChanged(account=account, plan=plan, at=now))
            return doc

        return account_view(await self.store.transaction(tx_body))

    async def set_plan(self, body: SetPlan) -> AccountView:
        """Operator request: an account's plan (R-TEN-3)."""
        account, plan = body.account, body.plan
        now = self.clock()

        async def tx_body(tx: Transaction) -> Doc:
            doc: Doc | None = await self.db.accounts.find_one_and_update(
                {"_id": account, "removed_at_ms": None},
                {"$set": {"plan": plan.value}},
                session=tx.session,
                return_document=True,
            )
            if doc is None:
                raise NotFound(f"no account {account!r}")
            emit(tx, AccountChanged(account=account, plan=plan, at=now))
            return dict(doc)

        return account_view(await self.store.transaction(tx_body))

    async def account(self, account: str) -> Doc | None:
        """The stored account (None: unknown or removed)."""
        doc: Doc | None = await self.db.accounts.find_one({"_id": account})
        return None if removed(doc) else doc

    async def remove_account(self, body: RemoveAccount) -> RemovedAccount:
        """Operator request: remove an account that holds no node (removal.py). In one
        transaction its document becomes a tombstone, its users' and unexpired console
        credentials and its remaining enrolments (devices, nodes never added) are put on the
        revocation list, its unspent join tokens are voided and `AccountRemoved` is written;
        then the revocations are pushed to the servers (their connections close at once)
        and the enrolled machines' consumers and log streams deleted."""
        account = body.account
        self._issuer()
        now = self.clock()

        async def tx_body(tx: Transaction) -> tuple[RemovedAccount, list[str]]:
            s = tx.session
            doc = await self.db.accounts.find_one({"_id": account}, session=s)
            live = self.db.nodes.find(
                {"owner": account, "state": {"$ne": "removed"}}, {"minion_id": 1}, session=s
            )
            nodes = tuple([str(n["minion_id"]) async for n in live])
            check_removal(account, doc, Holdings(nodes=nodes))
            await self.db.accounts.update_one(
                {"_id": account}, {"$set": {"removed_at_ms": now_ms(now)}}, session=s
            )
            users = await self.db.users.find({"account": account}, session=s).to_list(None)
            consoles = await self.db.console_credentials.find(
                {"account": account, "expires_at": {"$gt": int(time.time())}}, session=s
            ).to_list(None)
            enrolled = await self.db.enrolments.find(
                {"account": account, "state": "active"}, session=s
            ).to_list(None)
            revoked = {
                **{str(u["public_key"]): f"user:{account}/{u['user']}" for u in users},
                **{str(c["_id"]): f"console:{account}" for c in consoles},
                **{str(e["public_key"]): str(e["_id"]) for e in enrolled},
            }
            at = int(time.time()) + 1
            for key, whose in revoked.items():
                await self.db.revocations.update_one(
                    {"_id": key}, {"$set": {"at": at, "minion_id": whose}}, upsert=True, session=s
                )
            await self.db.users.delete_many({"account": account}, session=s)
            await self.db.console_credentials.delete_many({"account": account}, session=s)
            await self.db.enrolments.update_many(
                {"account": account, "state": "active"},
                {"$set": {"state": "revoked", "revoked_at_ms": now_ms(now)}},
                session=s,
            )
            voided = await self.db.join_tokens.delete_many(
                {"account": account, "used_at_ms": None}, session=s
            )
            emit(tx, AccountRemoved(account=account, at=now), msg_id=f"account-removed:{account}")
            reply = RemovedAccount(
                account=account,
                removed_at=now,
                users=sorted(str(u["user"]) for u in users),
                console_sessions=len(consoles),
                join_tokens=voided.deleted_count,
            )
            return reply, [str(e["_id"]) for e in enrolled]

        reply, machines = await self.store.transaction(tx_body)
        await self.push_revocations()
        js = await self._js()
        if js is not None:
            for minion_id in machines:
                await delete_node_consumer(js, minion_id)
                await delete_node_logs(js, minion_id)
        log.warning("account %s removed (%d users revoked)", account, len(reply.users))
        return reply

    async def list_accounts(self, body: ListAccounts) -> Accounts:
        """Every account, its plan and its users."""
        users: dict[str, list[str]] = {}
        async for u in self.db.users.find():
            users.setdefault(str(u["account"]), []).append(str(u["user"]))
        return Accounts(
            accounts=[
                account_view(d, sorted(users.get(d["_id"], [])))
                async for d in self.db.accounts.find().sort("_id", ASCENDING)
                if not removed(d)
            ]
        )

    async def add_user(self, body: AddUser) -> UserAdded:
        """Operator request: a user's credential, returned once (only its public key is
        kept). Adding a user again rotates its credential."""
        account, user = body.account, body.user
        issuer = self._issuer()
        if await self.account(account) is None:
            raise NotFound(f"no account {account!r}")
        creds = issuer.user(account, user)
        # One document per user (not an array in the account: nx-27017 stores a document
        # pushed into an array as a string, docs/nx-27017-gaps.md). Adding a user again
        # rotates the credential: the previous key is revoked.
        previous = await self.db.users.find_one({"_id": f"{account}/{user}"})
        await self.db.users.update_one(
            {"_id": f"{account}/{user}"},
            {
                "$set": {"account": account, "user": user, "public_key": creds.public_key},
                "$setOnInsert": {"created_at_ms": now_ms(self.clock())},
            },
            upsert=True,
        )
        if previous is not None and previous.get("public_key") != creds.public_key:
            await self.revoke_key(str(previous["public_key"]), f"user:{account}/{user}")
        return UserAdded(account=account, user=user, creds=creds.text())

    async def revoke_user(self, body: RevokeUser) -> UserRevoked:
        """Cut a user off at once: its key is revoked on the servers (its connections are
        closed) and it is no longer listed."""
        account, user = body.account, body.user
        self._issuer()
        doc = await self.db.users.find_one_and_delete({"_id": f"{account}/{user}"})
        if doc is None:
            raise NotFound(f"no user {user!r} in account {account!r}")
        await self.revoke_key(str(doc["public_key"]), f"user:{account}/{user}")
        log.warning("user %s of %s revoked", user, account)
        return UserRevoked(account=account, user=user)

    # --- join tokens and enrolment ---------------------------------------------------

    async def issue_join_token(self, body: IssueJoinToken, account: str) -> JoinTokenIssued:
        """A one-time join token for one node of the acting account (shown once); for a
        minion id another account holds, a decoy answered the same way (module docstring)."""
        return await self.join_token(
            account, body.minion_id, body.region, body.ttl_s, decoy_if_taken=True, joins="physical"
        )

    async def admin_issue_join_token(self, body: AdminIssueJoinToken) -> JoinTokenIssued:
        """An operator's: a one-time join token for one node of any account (not a removed
        one: its machines could never be spoken for)."""
        if removed(await self.db.accounts.find_one({"_id": body.account})):
            raise NotFound(f"no account {body.account!r}")
        return await self.join_token(
            body.account, body.minion_id, body.region, body.ttl_s, joins="any"
        )

    async def issue_device_join_token(self, body: IssueDeviceJoinToken) -> JoinTokenIssued:
        """device-fleet's, for a device of the account it acts for: a one-time token whose
        enrolment gives a device's credential (its own device's subjects only)."""
        return await self.join_token(
            body.account,
            body.minion_id,
            body.region,
            body.ttl_s,
            decoy_if_taken=True,
            joins="physical",
            kind="device",
        )

    async def joinable_region(self, account: str, region: str, joins: str) -> None:
        """A node joins one of its account's regions: as `node add` checks, the region
        exists, by owner and name, and, for `joins="physical"` (the account's own token), is
        a physical one (a cloud region's nodes come from bursting; an operator may enrol one
        by hand). Development's open regions let an agent create its own."""
        doc = await self.db.regions.find_one({"owner": account, "name": region})
        if doc is None:
            if self.open_regions:
                return
            raise invalid("region", "R-NODE-2", f"region {region!r} not found: create it first")
        if joins == "physical" and doc.get("provider") != "physical":
            raise invalid(
                "region", "R-NODE-2", "nodes join only physical regions (cloud nodes burst)"
            )

    async def join_token(
        self,
        account: str,
        minion_id: str,
        region: str,
        ttl_s: int,
        *,
        decoy_if_taken: bool = False,
        joins: str | None = None,
        kind: str = "node",
    ) -> JoinTokenIssued:
        """A minion id another account holds is refused (`conflict`: an operator, a burst),
        or, `decoy_if_taken` (the account's own request), answered with a decoy: made and
        answered alike, but kept where enrolment never looks, so it cannot enrol (nor
        reserve the id: `_taken` does not see it). `joins`: which regions a request's
        token may name (joinable_region)."""
        issuer = self._issuer()
        decoy = await self._taken(account, minion_id)
        if decoy and not decoy_if_taken:
            raise Refused("conflict", f"minion id {minion_id!r} is taken")
        if joins is not None:  # a request's: the region is checked (burst's exists)
            await self.joinable_region(account, region, joins)
        secret = secrets.token_urlsafe(32)
        expires = int(time.time()) + ttl_s
        kept = self.db.join_token_decoys if decoy else self.db.join_tokens
        await kept.insert_one(
            {
                "_id": _hash(secret),
                "account": account,
                "minion_id": minion_id,
                "region": region,
                "expires_at": expires,
                "used_at_ms": None,
                "issued_at_ms": now_ms(self.clock()),
                "kind": kind,  # node | device: the credential its enrolment gives
            }
        )
        if decoy:
            log.warning(
                "%s asked a join token for %s, another account's: a decoy", account, minion_id
            )
        token = JoinToken(issuer.enroll(minion_id, ttl_s), secret, minion_id).text()
        return JoinTokenIssued(minion_id=minion_id, region=region, expires_at=expires, token=token)

    async def enroll(self, cmd: EnrollNode, subject: str) -> NodeEnrolled:
        """A node exchanging its join token, on its own `gpufleet.v1.enroll.<minion_id>`
        (the only subject the token's credential may publish): the node the subject names
        must be the one the body names."""
        subject_minion = subjects.token_at(subject, 3)
        issuer = self._issuer()
        if subject_minion != cmd.minion_id:
            raise invalid("minion_id", "R-NODE-2", "not the minion id this token enrols")
        spent = await self.db.join_tokens.find_one_and_update(
            {
                "_id": _hash(cmd.secret),
                "minion_id": cmd.minion_id,
                "used_at_ms": None,
                "expires_at": {"$gt": int(time.time())},
            },
            {"$set": {"used_at_ms": now_ms(self.clock()), "public_key": cmd.public_key}},
        )
        if spent is None:
            raise NotFound("no such join token (unknown, spent or expired)")
        account, region = spent["account"], spent["region"]
        js = await self._js()
        if js is not None:
            try:
                await self._node_logs(js, cmd.minion_id)
            except Exception:  # the token stays good, for when an operator made room
                unspent = {"$set": {"used_at_ms": None}, "$unset": {"public_key": ""}}
                await self.db.join_tokens.update_one({"_id": spent["_id"]}, unspent)
                raise
        previous = await self.db.enrolments.find_one({"_id": cmd.minion_id, "account": account})
        try:
            # Conditional on the account: another account's row (even one written a moment
            # ago by a concurrent enrolment) makes the upsert collide on _id, and nothing
            # (consumer, credential) is made for it.
            await self.db.enrolments.update_one(
                {"_id": cmd.minion_id, "account": account},
                {
                    "$set": {
                        "account": account,
                        "region": region,
                        "public_key": cmd.public_key,
                        "state": "active",
                        "enrolled_at_ms": now_ms(self.clock()),
                        "kind": spent.get("kind", "node"),  # the credential it was given
                    }
                },
                upsert=True,
            )
        except DuplicateKeyError:
            # Taken meanwhile by another account: answered as an unknown token (R-TEN-2).
            raise NotFound("no such join token (unknown, spent or expired)") from None
        js = await self._js()
        if js is not None:
            # A fresh consumer, delivering only commands published from now on: a new host
            # is never handed the commands retained for the minion id before it enrolled.
            await delete_node_consumer(js, cmd.minion_id)
            await ensure_node_consumer(js, cmd.minion_id)
        if previous is not None and previous.get("public_key") != cmd.public_key:
            # Re-enrolled (a reinstalled host): the old key stops working.
            await self.revoke_key(previous["public_key"], cmd.minion_id)
        credential = issuer.device if spent.get("kind") == "device" else issuer.node
        jwt = credential(cmd.minion_id, cmd.public_key, account=account, region=region)
        log.info("node %s enrolled for %s in region %s", cmd.minion_id, account, region)
        return NodeEnrolled(jwt=jwt, account=account, region=region, minion_id=cmd.minion_id)

    async def _taken(self, account: str, minion_id: str) -> bool:
        """Whether `minion_id` is another account's: enrolled, a node of it, or promised
        to it by a join token still unspent and unexpired."""
        other = {"$ne": account}
        if await self.db.enrolments.find_one({"_id": minion_id, "account": other}):
            return True
        if await self.db.nodes.find_one({"minion_id": minion_id, "owner": other}):
            return True
        pending = await self.db.join_tokens.find_one(
            {
                "minion_id": minion_id,
                "account": other,
                "used_at_ms": None,
                "expires_at": {"$gt": int(time.time())},
            }
        )
        return pending is not None

    async def enrolment(self, minion_id: str) -> Doc | None:
        """The active enrolment of a node: its account and region (None: not enrolled)."""
        doc: Doc | None = await self.db.enrolments.find_one({"_id": minion_id, "state": "active"})
        return doc

    # --- revocation --------------------------------------------------------------------

    async def device_removed(self, evt: DeviceRemoved) -> None:
        """device-fleet removed a device: the enrolment its join token gave is revoked (its
        credential stops at once), if it is of the device's account, not a node's, and made
        before the removal: the minion id may be a newer device's since, which a late or
        redelivered event leaves alone. Nothing left to revoke changes nothing."""
        if evt.minion_id is None:
            return
        scope: Doc = {"kind": {"$ne": "node"}, "enrolled_at_ms": {"$lte": now_ms(evt.at)}}
        if await self.revoke(evt.minion_id, evt.account, scope):
            log.warning(
                "device %s of %s removed: its enrolment is revoked", evt.minion_id, evt.account
            )

    async def revoke(
        self, minion_id: str, account: str | None = None, scope: Doc | None = None
    ) -> bool:
        """Cut a node off: True if it had an active enrolment. With `account` (an
        account's own request) only that account's enrolment is revoked: another account's
        node of the same minion id is left alone, consumer included; `scope` narrows which
        enrolment further."""
        query: Doc = {"_id": minion_id, "state": "active", **(scope or {})}
        if account is not None:
            query["account"] = account
        doc = await self.db.enrolments.find_one_and_update(
            query,
            {"$set": {"state": "revoked", "revoked_at_ms": now_ms(self.clock())}},
        )
        if account is not None and doc is None:
            return False
        js = await self._js()
        if js is not None:
            await delete_node_consumer(js, minion_id)
            await delete_node_logs(js, minion_id)  # the logs it kept go with it
        if doc is None:
            return False
        await self.revoke_key(doc["public_key"], minion_id)
        log.warning("node %s revoked", minion_id)
        return True

    async def revoke_key(self, public_key: str, whose: str) -> None:
        """Revoke every JWT of `public_key` (a node's minion id, `user:<account>/<user>` or
        `console:<account>`)."""
        await self.db.revocations.update_one(
            {"_id": public_key},
            {"$set": {"at": int(time.time()) + 1, "minion_id": whose}},
            upsert=True,
        )
        await self.push_revocations()

    async def push_revocations(self) -> None:
        """Push the account JWT with every revocation to the servers (idempotent)."""
        if self.issuer is None or self.issuer.system_signing is None:
            return
        revoked = {d["_id"]: int(d["at"]) async for d in self.db.revocations.find()}
        if not revoked:
            return
        issued = max(max(revoked.values()), int(time.time()))
        account_jwt = self.issuer.account_jwt(revoked, issued_at=issued)
        nc = await self._system_connection()
        try:
            reply = await nc.request("$SYS.REQ.CLAIMS.UPDATE", account_jwt.encode(), timeout=5)
            data = json.loads(reply.data)
            if data.get("error"):
                raise RuntimeError(f"the server refused the account update: {data['error']}")
        finally:
            await nc.close()

    async def _system_connection(self) -> Client:
        assert self.issuer is not None
        tls = {k: v for k, v in self.connect_options.items() if k == "tls"}  # not its creds
        return await nats.connect(
            self.servers,
            name="gpufleet-provisioner-claims",
            allow_reconnect=False,
            **self.issuer.claims_pusher().connect_options(),
            **tls,
        )


def account_view(doc: Doc, users: list[str] | None = None) -> AccountView:
    return AccountView(account=doc["_id"], plan=doc["plan"], users=users or [])


def load_issuer(directory: Path | None) -> Issuer | None:
    return Issuer.load(directory) if directory else None
