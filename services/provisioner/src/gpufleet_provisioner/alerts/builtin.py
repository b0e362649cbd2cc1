"""The built-in alert rules (R-OPS-1, R-NODE-6): the operators', always evaluated, over the
series the node agents and services expose (docs/metrics.md). An account sees them, and
their alerts about its own series (their `account` or `owner` label)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet_contracts.alerts import AlertRuleSpec, Matcher

# The labels of one GPU's series as the node agent writes them (node: the minion id).
GPU = "node, gpu, gpu_uuid, job, account"


@dataclass(frozen=True)
class BuiltinRule:
    id: str
    spec: AlertRuleSpec


def builtin_rules(*, maintenance: bool = True, idle_for_s: float = 1800.0) -> list[BuiltinRule]:
    """The rules; `maintenance`: an XID or a rising uncorrected ECC count puts its node into
    maintenance (the alert is the reason)."""
    return [
        BuiltinRule(
            "builtin-gpu-xid",
            AlertRuleSpec(
                name="gpu-xid-error",
                # its value: the XID the driver raised last
                expr=f"gpufleet_gpu_last_xid and on ({GPU}) "
                "increase(gpufleet_gpu_xid_errors_total[5m]) > 0",
                labels={"severity": "critical"},
                annotations={
                    "summary": "GPU {{ $labels.gpu }} of node {{ $labels.node }} raised XID "
                    "{{ $value }}",
                },
                maintenance=maintenance,
            ),
        ),
        BuiltinRule(
            "builtin-gpu-ecc-uncorrected",
            AlertRuleSpec(
                name="gpu-ecc-uncorrected",
                # volatile or aggregate counts, whichever rises: one alert per GPU
                expr="max without (scope) "
                '(increase(gpufleet_gpu_ecc_errors{counter="uncorrected"}[10m])) > 0',
                labels={"severity": "critical"},
                annotations={
                    "summary": "GPU {{ $labels.gpu }} of node {{ $labels.node }}: uncorrected "
                    "ECC errors are rising",
                },
                maintenance=maintenance,
            ),
        ),
        BuiltinRule(
            "builtin-gpu-temperature",
            AlertRuleSpec(
                name="gpu-over-temperature",
                series="gpufleet_gpu_temperature_celsius",
                comparison=">",
                threshold=85.0,
                for_s=300.0,
                labels={"severity": "warning"},
                annotations={
                    "summary": "GPU {{ $labels.gpu }} of node {{ $labels.node }} at "
                    "{{ $value }} °C",
                },
            ),
        ),
        BuiltinRule(
            "builtin-node-heartbeat",
            AlertRuleSpec(
                name="node-heartbeat-lost",
                series="gpufleet_node_up",
                comparison="==",
                threshold=0.0,
                for_s=60.0,
                labels={"severity": "critical"},
                annotations={"summary": "node {{ $labels.node }} sends no heartbeat"},
            ),
        ),
        BuiltinRule(
            "builtin-billed-gpu-idle",
            AlertRuleSpec(
                name="billed-gpu-idle",
                series="gpufleet_gpu_utilization_percent",
                matchers=[Matcher(label="job", op="!=", value="")],
                comparison="<",
                threshold=5.0,
                for_s=idle_for_s,
                labels={"severity": "warning"},
                annotations={
                    "summary": "job {{ $labels.job }} pays for GPU {{ $labels.gpu }} of node "
                    "{{ $labels.node }}, {{ $value }} % used",
                },
            ),
        ),
    ]
