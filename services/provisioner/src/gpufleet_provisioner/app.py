"""Composition root of the provisioner; every subject it handles is wired here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, cast

from faststream import FastStream
from faststream.nats import NatsBroker, NatsMessage
from gpufleet_bus import BusSettings, ServiceRuntime, account_of, on_its_own_subject
from gpufleet_bus.publish import Publisher
from gpufleet_contracts import ErrorBody, ErrorReply, FieldError, subjects
from gpufleet_contracts.identity import (
    AccountChanged,
    AddUser,
    AdminIssueJoinToken,
    CreateAccount,
    EnrollNode,
    IssueJoinToken,
    RevokeNode,
    RevokeUser,
    SetPlan,
)
from gpufleet_contracts.jobs import PendingDemandChanged
from gpufleet_contracts.nodes import (
    CloudInstanceEvent,
    NodeHeartbeat,
    NodeRegistered,
    NodeStateChanged,
    RegisterNode,
)
from gpufleet_contracts.providers import ProviderEnabled, RegionCreated
from gpufleet_store import Store, utcnow

from .cloud import CloudManager
from .gcp import GcpEndpoints
from .identity import INDEXES as IDENTITY_INDEXES
from .identity import Identity, load_issuer
from .service import INDEXES, Provisioner, Refused
from .settings import ProvisionerSettings

SERVICE = "provisioner"
log = logging.getLogger("gpufleet.provisioner")

Doc = dict[str, Any]


async def guarded(fn: Callable[[], Awaitable[Any]]) -> Doc:
    """A refusal becomes an ErrorReply; the request's own content is never logged (keys)."""
    try:
        result = await fn()
    except Refused as exc:
        return ErrorReply(
            error=ErrorBody(
                code=exc.code,
                message=exc.message,
                fields=[FieldError(**f) for f in exc.fields],
            )
        ).model_dump(mode="json")
    return result if isinstance(result, dict) else {"result": result}


async def _dump(result: Awaitable[Any]) -> Doc:
    value = await result
    dumped: Doc = value.model_dump(mode="json")
    return dumped


def _str(body: Doc, name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or not value:
        raise Refused(
            "invalid",
            f"{name} is required",
            [{"field": name, "rule": "schema:missing", "message": "a non-empty string"}],
        )
    return value


def build_app(
    store: Store,
    broker: NatsBroker,
    clock: Callable[[], datetime] = utcnow,
    auto_activate: bool | None = None,
    settings: ProvisionerSettings | None = None,
    endpoints: GcpEndpoints | None = None,
    identity: Identity | None = None,
    bus: BusSettings | None = None,
) -> tuple[FastStream, Provisioner]:
    settings = settings or ProvisionerSettings()
    bus = bus or BusSettings()
    rt = ServiceRuntime(SERVICE, broker, store, indexes={**INDEXES, **IDENTITY_INDEXES}, bus=bus)
    if auto_activate is None:
        auto_activate = settings.auto_activate_nodes
    ident = identity or Identity(
        store, load_issuer(settings.auth_dir), clock, bus.servers, bus.connect_options()
    )
    prov = Provisioner(store, clock, auto_activate, settings, identity=ident)
    cloud = CloudManager(prov, cast(Publisher, broker), endpoints)
    rt.publishes(
        NodeRegistered,
        NodeStateChanged,
        ProviderEnabled,
        RegionCreated,
        CloudInstanceEvent,
        AccountChanged,
    )

    # --- events and commands (JetStream, durable) ---
    @rt.on_event(RegisterNode, "register-node")
    async def on_register_node(body: RegisterNode, msg: NatsMessage) -> None:
        """The node is the one the subject names (only its credential may publish there);
        its account and region are its enrolment's, never the payload's."""
        minion = subjects.token_at(msg.raw_message.subject, 4)
        enrolled = await ident.enrolment(minion or "")
        if minion != body.minion_id or enrolled is None:
            log.warning(
                "RegisterNode for %s on %s: not an enrolled node's own subject; ignored",
                body.minion_id,
                msg.raw_message.subject,
            )
            return
        await prov.register(
            body, (msg.headers or {}).get("ce-id"), enrolled["account"], enrolled["region"]
        )

    # --- identities: enrolment (core NATS), accounts and join tokens ---
    @broker.subscriber(
        f"{subjects.ENROLL}.*", queue=f"{SERVICE}-enroll", title="provisioner:enroll"
    )
    async def enroll(body: EnrollNode, msg: NatsMessage) -> Doc:
        minion = subjects.token_at(msg.raw_message.subject, 3)
        return await guarded(
            lambda: _dump(ident.enroll(minion, body)),
        )

    @rt.on_request("issue_join_token", description=IssueJoinToken.__doc__)
    async def issue_join_token(body: IssueJoinToken, msg: NatsMessage) -> Doc:
        return await guarded(
            lambda: ident.issue_join_token(account_of(msg), body.minion_id, body.region, body.ttl_s)
        )

    @rt.on_admin("issue_join_token", description=AdminIssueJoinToken.__doc__)
    async def admin_issue_join_token(body: AdminIssueJoinToken) -> Doc:
        return await guarded(
            lambda: ident.issue_join_token(body.account, body.minion_id, body.region, body.ttl_s)
        )

    @rt.on_request("revoke_node", description=RevokeNode.__doc__)
    async def revoke_node(body: RevokeNode, msg: NatsMessage) -> Doc:
        return await guarded(lambda: prov.remove_node(account_of(msg), body.node, revoke=True))

    @rt.on_admin("create_account", description=CreateAccount.__doc__)
    async def create_account(body: CreateAccount) -> Doc:
        return await guarded(lambda: ident.create_account(body.account, body.plan))

    @rt.on_admin("set_plan", description=SetPlan.__doc__)
    async def set_plan(body: SetPlan) -> Doc:
        return await guarded(lambda: ident.set_plan(body.account, body.plan))

    @rt.on_admin("add_user", description=AddUser.__doc__)
    async def add_user(body: AddUser) -> Doc:
        return await guarded(lambda: ident.add_user(body.account, body.user))

    @rt.on_admin("revoke_user", description=RevokeUser.__doc__)
    async def revoke_user(body: RevokeUser) -> Doc:
        return await guarded(lambda: ident.revoke_user(body.account, body.user))

    @rt.on_admin("list_accounts", description="Every account, its plan and its users.")
    async def list_accounts() -> Doc:
        return {"accounts": await ident.list_accounts()}

    @rt.on_event(PendingDemandChanged, "pending-demand")
    async def on_pending_demand(body: PendingDemandChanged) -> None:
        await cloud.on_pending_demand(body)

    @rt.on_event(CloudInstanceEvent, "cloud-instance")
    async def on_cloud_instance(body: CloudInstanceEvent, msg: NatsMessage) -> None:
        await cloud.on_cloud_event(body, (msg.headers or {}).get("ce-id"))

    @broker.subscriber(
        f"{subjects.HEARTBEATS}.*",
        queue=f"{SERVICE}-heartbeats",
        title="provisioner:heartbeat",
        no_reply=True,  # not a request: never answered, whatever reply subject it carries
    )
    async def on_heartbeat(body: NodeHeartbeat, msg: NatsMessage) -> None:
        """The node is the one the subject names (only its credential may publish there):
        a heartbeat naming another node in its body refreshes nothing."""
        if on_its_own_subject(msg, body.minion_id):
            await prov.heartbeat(body)

    # --- requests (core NATS) ---
    @rt.on_request("list_nodes", description="The acting account's nodes.")
    async def list_nodes(msg: NatsMessage) -> Doc:
        return {"nodes": await prov.list_nodes(account_of(msg))}

    @rt.on_request(
        "enable_provider",
        description="Enable `physical` or `gcp` (with a service-account key) once (R-PROV-1/2).",
    )
    async def enable_provider(body: Doc, msg: NatsMessage) -> Doc:
        account = account_of(msg)

        async def run() -> Doc:
            provider = _str(body, "provider")
            mode = _str(body, "payment_mode", "credits")
            if provider == "physical":
                return await prov.enable_physical(account, mode)
            if provider == "gcp":
                key = body.get("key_json")
                return await cloud.enable_gcp(account, mode, key if isinstance(key, str) else None)
            raise Refused(
                "invalid",
                f"unknown provider {provider!r}",
                [
                    {
                        "field": "provider",
                        "rule": "R-PROV-1",
                        "message": "unknown provider",
                        "valid": "physical | gcp",
                    }
                ],
            )

        return await guarded(run)

    @rt.on_request("list_providers")
    async def list_providers(msg: NatsMessage) -> Doc:
        return {"providers": await prov.list_providers(account_of(msg))}

    @rt.on_request("set_burst_policy", description="Burst policy of the account (R-SCHED-3).")
    async def set_burst_policy(body: Doc, msg: NatsMessage) -> Doc:
        return await guarded(lambda: cloud.set_policy(account_of(msg), body))

    @rt.on_request("create_region", description="A physical (R-REG-1) or GCP (R-REG-2) region.")
    async def create_region(body: Doc, msg: NatsMessage) -> Doc:
        account = account_of(msg)

        async def run() -> Doc:
            provider = _str(body, "provider", "physical")
            name = _str(body, "name")
            if provider == "gcp":
                return await cloud.create_region(
                    account, name, str(body.get("storage_class") or "standard")
                )
            return await prov.create_physical_region(
                account,
                name,
                str(body.get("storage_mode") or "local"),
                bool(body.get("allow_public_jobs", False)),
            )

        return await guarded(run)

    @rt.on_request("list_regions")
    async def list_regions(msg: NatsMessage) -> Doc:
        return {"regions": await prov.list_regions(account_of(msg))}

    @rt.on_request("region_quotas", description="A GCP region's quotas and runnable jobs.")
    async def region_quotas(body: Doc, msg: NatsMessage) -> Doc:
        return await guarded(lambda: cloud.region_quotas(account_of(msg), _str(body, "name")))

    @rt.on_request("add_node", description="Add a compute or storage node by minion id.")
    async def add_node(body: Doc, msg: NatsMessage) -> Doc:
        return await guarded(
            lambda: prov.add_node(
                account_of(msg),
                _str(body, "region"),
                _str(body, "name"),
                _str(body, "minion_id"),
                str(body.get("kind") or "compute"),
                upnp=bool(body.get("upnp", True)),
                mining=bool(body.get("mining", False)),
                replace=bool(body.get("replace", False)),
            )
        )

    @rt.on_request("show_node")
    async def show_node(body: Doc, msg: NatsMessage) -> Doc:
        return await guarded(lambda: prov.show_node(account_of(msg), _str(body, "node")))

    @rt.on_request("toggle_maintenance")
    async def toggle_maintenance(body: Doc, msg: NatsMessage) -> Doc:
        return await guarded(lambda: prov.toggle_maintenance(account_of(msg), _str(body, "node")))

    @rt.on_request("remove_node")
    async def remove_node(body: Doc, msg: NatsMessage) -> Doc:
        return await guarded(lambda: prov.remove_node(account_of(msg), _str(body, "node")))

    # --- the tick: liveness and burst decisions ---
    tasks: list[asyncio.Task[None]] = []

    async def tick() -> None:
        while True:
            await asyncio.sleep(settings.provisioner_tick_s)
            try:
                await prov.sweep_liveness()
                await cloud.burst_pass()
            except Exception:
                log.exception(
                    "provisioner tick failed; next one in %.1fs", settings.provisioner_tick_s
                )

    async def started() -> None:
        ident.js = (await broker.connect()).jetstream()
        try:
            await ident.push_revocations()  # a server that lost them gets them again
        except Exception:
            log.exception("could not push the revocation list; retried at the next revocation")
        await cloud.start()
        tasks.append(asyncio.create_task(tick(), name="provisioner-tick"))

    async def stopping() -> None:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        cloud.stop()

    rt.app.after_startup(started)
    rt.app.on_shutdown(stopping)
    return rt.app, prov
