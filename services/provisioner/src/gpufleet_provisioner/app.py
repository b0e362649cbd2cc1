"""Composition root of the provisioner: providers, regions and nodes, node enrolment and
identities, liveness and bursting. Every subject it handles is wired here, in one table.

    records       the stored providers, regions and nodes; a node's state changes (records.py)
    providers     an account's providers and regions, physical side (providers.py)
    nodes         an account's nodes: add, show, list, maintenance, remove (nodes.py)
    registration  a node agent's registration and its hardware check (registration.py)
    checks        verified nodes: GPU checks asked, answered and judged (checks.py)
    liveness      heartbeats; a silent node is lost (liveness.py)
    identity      accounts, users, join tokens, enrolment, revocation (identity.py)
    alerts        alert rules, their evaluation against Prometheus, alerts (alerts/)
    console       console sign-in: one-time codes for short-lived credentials (console.py)
    cloud, burst  Google Cloud: keys, regions, quotas, bursting, instances (cloud.py, burst.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from gpufleet_bus import Every, Ports, Request, Service, ServiceRuntime
from gpufleet_bus.publish import Publisher
from gpufleet_contracts import subjects
from gpufleet_contracts.alerts import AlertFired, AlertResolved
from gpufleet_contracts.console import CODE_TTL_S, EndConsoleSession, RedeemConsoleCode
from gpufleet_contracts.datastores import GetNodeFacts, GetRegionFacts
from gpufleet_contracts.devices import IssueDeviceJoinToken
from gpufleet_contracts.identity import AccountChanged, AccountRemoved, EnrollNode
from gpufleet_contracts.nodes import (
    CloudInstanceEvent,
    NodeHeartbeat,
    NodeRegistered,
    NodeStateChanged,
)
from gpufleet_contracts.providers import ProviderEnabled, RegionCreated
from gpufleet_contracts.verification import NodeVerified, VerifyGpus
from gpufleet_telemetry.exposition import Source

from .alerts.book import INDEXES as ALERT_INDEXES
from .alerts.book import AlertBook
from .alerts.builtin import builtin_rules
from .alerts.evaluation import Evaluator
from .alerts.prometheus import Prometheus
from .alerts.requests import AlertRequests
from .alerts.views import from_builtin
from .burst import Bursting
from .checks import NodeChecks
from .cloud import CloudAccounts
from .console import INDEXES as CONSOLE_INDEXES
from .console import ConsoleSignIn
from .identity import INDEXES as IDENTITY_INDEXES
from .identity import Identity, load_issuer
from .liveness import Liveness
from .metrics import ProvisionerMetrics
from .nodes import NodeRequests
from .providers import ProviderRequests
from .records import INDEXES, Records
from .regionfacts import RegionFactsRequests
from .registration import Registration
from .settings import ProvisionerSettings

SERVICE = "provisioner"


@dataclass(frozen=True)
class Provisioner:
    """The provisioner's parts (what `build_app` returns as the service's core)."""

    records: Records
    identity: Identity
    providers: ProviderRequests
    nodes: NodeRequests
    registration: Registration
    checks: NodeChecks
    liveness: Liveness
    cloud: CloudAccounts
    burst: Bursting

    async def tick(self) -> None:
        """The burst decisions (made again from stored state). Liveness has its own round
        (liveness.py), never behind a burst pass."""
        await self.burst.burst_pass()


def build_app(ports: Ports, settings: ProvisionerSettings | None = None) -> Service[Provisioner]:
    settings = settings or ProvisionerSettings()
    store = ports.db
    identity = Identity(
        store,
        load_issuer(settings.auth_dir),
        ports.clock,
        ports.bus,
        ports.broker,
        logs=settings.node_logs(),
        open_regions=settings.auto_activate_nodes,
    )
    records = Records(store, ports.clock, settings, identity)
    cloud = CloudAccounts(records, cast(Publisher, ports.broker))
    checks = NodeChecks(records)
    prov = Provisioner(
        records=records,
        identity=identity,
        providers=ProviderRequests(records, cloud),
        nodes=NodeRequests(records),
        registration=Registration(records, identity, checks),
        checks=checks,
        liveness=Liveness(records),
        cloud=cloud,
        burst=Bursting(records, cloud, identity),
    )
    nodes, providers, burst = prov.nodes, prov.providers, prov.burst
    console = ConsoleSignIn(store, identity.issuer, ports.clock, identity.revoke_key)
    builtin = [
        from_builtin(r) for r in builtin_rules(maintenance=settings.alert_builtin_maintenance)
    ]
    book = AlertBook(records, settings.alert_rules_per_account, settings.alert_resolved_keep_s)
    prometheus = (
        Prometheus(settings.prometheus_url, settings.alert_query_timeout_s)
        if settings.prometheus_url
        else None
    )
    alerts = AlertRequests(book, builtin, ports.clock, prometheus)
    evaluations = (
        []
        if prometheus is None
        else [
            Every(
                settings.alert_eval_s,
                Evaluator(
                    book, prometheus, builtin, ports.clock, settings.alert_instances_per_rule
                ).round,
                "alerts",
                at_start=False,
            )
        ]
    )

    indexes = {**INDEXES, **IDENTITY_INDEXES, **CONSOLE_INDEXES, **ALERT_INDEXES}
    facts = RegionFactsRequests(records)  # the datastore service's questions
    rt = ServiceRuntime(SERVICE, ports, indexes=indexes)
    rt.wire(
        requests={
            "list_nodes": nodes.list_nodes,
            "add_node": nodes.add_node,
            "show_node": nodes.show_node,
            "set_maintenance": nodes.set_maintenance,
            "remove_node": nodes.remove_node,
            "revoke_node": nodes.revoke_node,
            "issue_join_token": identity.issue_join_token,
            "enable_provider": providers.enable_provider,
            "list_providers": providers.list_providers,
            "create_region": providers.create_region,
            "list_regions": providers.list_regions,
            "region_quotas": cloud.region_quotas,
            "set_burst_policy": cloud.set_burst_policy,
            "verify_node": checks.verify_node,
            "open_console_session": console.open,
            "add_alert_rule": alerts.add_alert_rule,
            "list_alert_rules": alerts.list_alert_rules,
            "remove_alert_rule": alerts.remove_alert_rule,
            "list_alerts": alerts.list_alerts,
        },
        admin={
            "create_account": identity.create_account,
            "remove_account": identity.remove_account,
            "set_plan": identity.set_plan,
            "add_user": identity.add_user,
            "revoke_user": identity.revoke_user,
            "list_accounts": identity.list_accounts,
            "issue_join_token": identity.admin_issue_join_token,
            "verify_node": checks.admin_verify_node,
            "open_console_session": console.admin_open,
            "add_alert_rule": alerts.add_operator_rule,
            "list_alert_rules": alerts.list_all_rules,
            "remove_alert_rule": alerts.remove_operator_rule,
            "list_alerts": alerts.list_all_alerts,
        },
        direct={
            # what regional resources need of an account's region (the datastore service's)
            GetRegionFacts.SUBJECT: Request(facts.region_facts, description=GetRegionFacts.__doc__),
            GetNodeFacts.SUBJECT: Request(facts.node_facts, description=GetNodeFacts.__doc__),
            # a device's join token, asked by device-fleet for the account it acts for
            IssueDeviceJoinToken.SUBJECT: Request(
                identity.issue_device_join_token, description=IssueDeviceJoinToken.__doc__
            ),
            # a node exchanging its join token (core NATS request/reply)
            subjects.wildcard(EnrollNode.SUBJECT): Request(
                identity.enroll, description=EnrollNode.__doc__
            ),
            # the console gateway redeeming a sign-in code (console.py)
            RedeemConsoleCode.SUBJECT: Request(
                console.redeem, description=RedeemConsoleCode.__doc__
            ),
            # ... and ending a session at its person's sign-out
            EndConsoleSession.SUBJECT: Request(console.end, description=EndConsoleSession.__doc__),
        },
        events={
            "register-node": prov.registration.register_node,
            "pending-demand": burst.on_pending_demand,
            "cloud-instance": burst.on_cloud_event,
            # a node's answer to its GPU check, on its own subject
            "gpu-checked": checks.reported,
            # a device removed by device-fleet: its enrolment revoked
            "device-removed": identity.device_removed,
        },
        signals={subjects.wildcard(NodeHeartbeat.SUBJECT): prov.liveness.heartbeat},
        metrics=[Source("nodes", ProvisionerMetrics(prov.liveness).collect)],
        every=[
            Every(settings.provisioner_tick_s, prov.liveness.round, "liveness", at_start=False),
            Every(settings.provisioner_tick_s, prov.tick, "provisioner-tick", at_start=False),
            Every(settings.node_check_round_s, checks.round, "node-checks", at_start=False),
            Every(CODE_TTL_S, console.expire, "console-codes", at_start=False),
            *evaluations,
        ],
        publishes=[
            NodeRegistered,
            NodeStateChanged,
            NodeVerified,
            VerifyGpus,
            ProviderEnabled,
            RegionCreated,
            CloudInstanceEvent,
            AccountChanged,
            AccountRemoved,
            AlertFired,
            AlertResolved,
        ],
        startup=[identity.start, cloud.start],
        shutdown=[cloud.stop, *([] if prometheus is None else [prometheus.close])],
    )
    return rt.built(prov)
