"""Projects and the plans of accounts, as the scheduler keeps them (R-TEN-1, R-TEN-3).

`projects`: `{_id: "<owner>/<name>", owner, name, members: [account], created_ms}`. A project
is created by `create_project` or by the first job that names it (a plain name: the acting
account's own project). Projects are never deleted, so which exist is cached.

`accounts`: `{_id: account, plan, changed_ms, removed_ms}`, each account's plan as the
provisioner's `AccountChanged` events tell it (the provisioner owns accounts), and when its
`AccountRemoved` came: no job is admitted for a removed account, as owner or creator. An
account no event has named (one nobody created: development without `just up`) is on plan
`free`.

Writes are transactions (`Store.transaction`): one at a time per process, which nx-27017 needs.
"""

from __future__ import annotations

import asyncio
import time

from gpufleet_contracts import FieldError
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.identity import AccountChanged, AccountRemoved, Plan
from gpufleet_contracts.projects import PROJECT_MEMBERS, parse_project, project_id
from gpufleet_store import Doc, Store, Transaction, now_ms
from pymongo import ASCENDING, IndexModel

from . import tenancy

REMOVED_READ_S = 1.0  # how stale this instance's list of removed accounts may be

INDEXES = {
    # No index on `members`: nx-27017 then stops matching `{members: x}` at all
    # (docs/nx-27017-gaps.md). A member's submission finds the project by `_id`; only
    # `list_projects` reads the collection through.
    "projects": [IndexModel([("owner", ASCENDING), ("name", ASCENDING)])],
    "accounts": [],
}


def refused(code: str, message: str, *fields: FieldError) -> Refused:
    return Refused(code, message, fields)


def _not_found(ref: str, field: str = "project") -> Refused:
    # Another account's project answers like one that does not exist (R-TEN-2).
    return refused(
        "not_found",
        f"project {ref} not found",
        FieldError(
            field=field,
            rule="R-TEN-2",
            message=f"no project {ref} of yours, nor one you are a member of",
            valid="a project of yours, or <owner>/<name> of a project you are a member of",
        ),
    )


class Projects:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.db = store.db
        self._known: set[str] = set()  # project ids that exist (never deleted)
        self._ensuring: dict[str, asyncio.Future[None]] = {}
        self._removed: frozenset[str] = frozenset()  # removed accounts, as last read
        self._removed_read = -REMOVED_READ_S

    # --- plans -----------------------------------------------------------------------

    async def account_changed(self, evt: AccountChanged) -> None:
        """Record an account's plan; an older event than the one recorded changes nothing."""
        at = now_ms(evt.at)

        async def body(tx: Transaction) -> None:
            s = tx.session
            known = await self.db.accounts.find_one({"_id": evt.account}, session=s)
            if known is not None and int(known.get("changed_ms") or 0) > at:
                return
            plan = {"plan": evt.plan.value, "changed_ms": at}  # its removal, if any, stays
            await self.db.accounts.update_one(
                {"_id": evt.account}, {"$set": plan}, upsert=True, session=s
            )

        await self.store.transaction(body)

    async def account_removed(self, evt: AccountRemoved) -> None:
        """Record an account's removal (a redelivery keeps the first time)."""

        async def body(tx: Transaction) -> None:
            s = tx.session
            known = await self.db.accounts.find_one({"_id": evt.account}, session=s)
            if known is not None and known.get("removed_ms") is not None:
                return
            removed = {"removed_ms": now_ms(evt.at)}
            await self.db.accounts.update_one(
                {"_id": evt.account}, {"$set": removed}, upsert=True, session=s
            )

        await self.store.transaction(body)
        self._removed |= {evt.account}

    async def check_live(self, ref: str, owner: str, creator: str) -> None:
        """R-TEN-1: a job in project `ref` of a removed account, or submitted by a removed
        account (an EnqueueJob published before its removal and read after it), is not
        admitted: the project answers as one that does not exist."""
        if {owner, creator} & await self._removed_accounts():
            raise _not_found(ref, "spec.project")

    async def _removed_accounts(self) -> frozenset[str]:
        """The removed accounts, read again at most every REMOVED_READ_S: a submission
        pays no read of its own (another instance's removal is seen within that time)."""
        if time.monotonic() - self._removed_read >= REMOVED_READ_S:
            self._removed_read = time.monotonic()
            docs = self.db.accounts.find({}, {"removed_ms": 1})
            self._removed = frozenset(
                [d["_id"] async for d in docs if d.get("removed_ms") is not None]
            )
        return self._removed

    async def plan_of(self, account: str) -> Plan:
        doc = await self.db.accounts.find_one({"_id": account})
        # an account this scheduler knows only as removed has no plan
        return Plan(doc["plan"]) if doc and doc.get("plan") else Plan.free

    async def check_plan(self, owner: str, uses: list[tuple[str, str]]) -> None:
        """R-TEN-3 for a job of `owner`'s project that uses these regional resources."""
        if not uses:
            return
        reply = tenancy.plan_refusal(owner, await self.plan_of(owner), uses)
        if reply is not None:
            raise Refused(reply.error.code, reply.error.message, reply.error.fields)

    # --- a job's project -------------------------------------------------------------

    async def resolve(self, ref: str, account: str) -> tuple[str, str]:
        """(owner, name) of the project `account` names `ref` in a job: its own (a plain name,
        or its own `<account>/<name>`) or one of another account that it is a member of."""
        parsed = parse_project(ref)
        owner = parsed.owner_for(account)
        if owner != account:
            member = await self.db.projects.find_one(
                {"_id": project_id(owner, parsed.name), "members": account}, {"_id": 1}
            )
            if member is None:
                raise _not_found(ref, "spec.project")
        return owner, parsed.name

    async def ensure(self, owner: str, name: str) -> None:
        """The owner's project exists (created on first use, without members). Submissions
        of a new project that arrive together share one write (a benchmark's first 4,096)."""
        pid = project_id(owner, name)
        if pid in self._known:
            return
        task = self._ensuring.get(pid)
        if task is None:
            task = self._ensuring[pid] = asyncio.ensure_future(self._create_once(pid, owner, name))
            task.add_done_callback(lambda _: self._ensuring.pop(pid, None))
        await asyncio.shield(task)

    async def _create_once(self, pid: str, owner: str, name: str) -> None:
        async def body(tx: Transaction) -> None:
            await self.db.projects.update_one(
                {"_id": pid},
                {
                    "$setOnInsert": {
                        "owner": owner,
                        "name": name,
                        "members": [],
                        "created_ms": now_ms(),
                    }
                },
                upsert=True,
                session=tx.session,
            )

        await self.store.transaction(body)
        self._known.add(pid)

    # --- requests --------------------------------------------------------------------

    async def create(self, account: str, name: str) -> Doc:
        pid = project_id(account, name)

        async def body(tx: Transaction) -> Doc:
            s = tx.session
            if await self.db.projects.find_one({"_id": pid}, {"_id": 1}, session=s):
                raise refused(
                    "conflict",
                    f"project {name} already exists",
                    FieldError(
                        field="name",
                        rule="R-TEN-1",
                        message=f"you have a project {name} already",
                        valid="a name none of your projects has",
                    ),
                )
            doc: Doc = {
                "_id": pid,
                "owner": account,
                "name": name,
                "members": [],
                "created_ms": now_ms(),
            }
            await self.db.projects.insert_one(doc, session=s)
            return doc

        doc = await self.store.transaction(body)
        self._known.add(pid)
        return tenancy.project_view(doc, account)

    def _own(self, ref: str, account: str) -> str:
        """The id of `account`'s own project `ref`; a project of another account, even one
        `account` is a member of, is "not found": only the owner manages members."""
        parsed = parse_project(ref)
        if parsed.owner_for(account) != account:
            raise _not_found(ref)
        return project_id(account, parsed.name)

    async def add_member(self, account: str, ref: str, member: str) -> Doc:
        pid = self._own(ref, account)
        if member == account:
            raise refused(
                "invalid",
                "the owner of a project is not one of its members",
                FieldError(
                    field="account",
                    rule="R-TEN-1",
                    message="you own this project already",
                    valid="another account",
                ),
            )
        if await self.db.accounts.find_one({"_id": member}, {"_id": 1}) is None:
            raise refused(
                "not_found",
                f"no account {member}",
                FieldError(
                    field="account",
                    rule="R-TEN-1",
                    message=f"no account {member} is known",
                    valid="the name of an existing account",
                ),
            )

        async def body(tx: Transaction) -> Doc:
            s = tx.session
            doc: Doc | None = await self.db.projects.find_one({"_id": pid}, session=s)
            if doc is None:
                raise _not_found(ref)
            members = list(doc.get("members") or [])
            if member in members:
                return doc  # already one: nothing changes
            if len(members) >= PROJECT_MEMBERS:
                raise refused(
                    "invalid",
                    f"a project has at most {PROJECT_MEMBERS} members",
                    FieldError(
                        field="account",
                        rule="limit:project_members",
                        message=f"project {doc['name']} has {len(members)} members",
                        valid=f"at most {PROJECT_MEMBERS} members",
                    ),
                )
            await self.db.projects.update_one(
                {"_id": pid}, {"$addToSet": {"members": member}}, session=s
            )
            return {**doc, "members": [*members, member]}

        return tenancy.project_view(await self.store.transaction(body), account)

    async def remove_member(self, account: str, ref: str, member: str) -> Doc:
        pid = self._own(ref, account)

        async def body(tx: Transaction) -> Doc:
            s = tx.session
            doc: Doc | None = await self.db.projects.find_one({"_id": pid}, session=s)
            if doc is None:
                raise _not_found(ref)
            members = list(doc.get("members") or [])
            if member not in members:
                raise refused(
                    "not_found",
                    f"{member} is not a member of project {doc['name']}",
                    FieldError(
                        field="account",
                        rule="R-TEN-1",
                        message=f"{member} is not a member",
                        valid=", ".join(sorted(members)) or "the project has no members",
                    ),
                )
            await self.db.projects.update_one(
                {"_id": pid}, {"$pull": {"members": member}}, session=s
            )
            return {**doc, "members": [m for m in members if m != member]}

        return tenancy.project_view(await self.store.transaction(body), account)

    async def list(self, account: str, limit: int = 100) -> list[Doc]:
        """The projects `account` owns, then those it is a member of, each group by id."""
        owned = (
            await self.db.projects.find({"owner": account}).sort("_id", ASCENDING).to_list(limit)
        )
        joined: list[Doc] = []
        if len(owned) < limit:
            joined = (
                await self.db.projects.find({"members": account})
                .sort("_id", ASCENDING)
                .to_list(limit - len(owned))
            )
        return [tenancy.project_view(d, account) for d in owned + joined]
