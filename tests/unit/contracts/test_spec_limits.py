"""The caps of gpufleet_contracts.limits: a spec too big for its events is refused with field
`spec` and rule `limit:spec_bytes`, and each list and string a user fills has its own cap,
refused as `limit:<name>` with the cap as what would be valid."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_contracts import field_errors, limits
from gpufleet_contracts.jobs import JobQueued, JobSpec, StartWorker, SubmitJob
from pydantic import ValidationError

BASE: dict[str, Any] = {"name": "hello", "gpu_types": ["RTX 3090"], "command": ["true"]}
NATS_MAX_PAYLOAD = 1024 * 1024  # nats-server's default
ROUTE = {"path": "/p", "file": "app.py", "function": "f"}
ENDPOINT = {
    "type": "endpoint",
    "command": [],
    "model": {"source": "git", "path": "https://github.com/me/m.git"},
}


def refused(**spec: Any) -> dict[str, tuple[str, str | None]]:
    with pytest.raises(ValidationError) as info:
        SubmitJob.model_validate_json(json.dumps({"spec": {**BASE, **spec}}))
    return {e.field: (e.rule, e.valid) for e in field_errors(info.value)}


def json_size(data: dict[str, Any]) -> int:
    return len(JobSpec.model_construct(**data).model_dump_json(by_alias=True))


def padded(size: int) -> dict[str, Any]:
    """A spec whose JSON is exactly `size` bytes, padded with environment variables."""
    env: dict[str, str] = {}
    data = {**BASE, "env": env}
    while json_size(data) + 2100 < size:  # 2,000-character values while there is room...
        env[f"V{len(env)}"] = "x" * 2000
    env["LAST"] = ""  # ...then one that takes what is left (82 to 2,100 bytes)
    env["LAST"] = "x" * (size - json_size(data))
    assert json_size(data) == size
    return data


def test_a_spec_at_the_cap_is_accepted_and_its_event_fits_nats() -> None:
    data = padded(limits.SPEC_BYTES)
    spec = JobSpec.model_validate(data)
    assert len(spec.model_dump_json(by_alias=True)) == limits.SPEC_BYTES
    queued = JobQueued(
        job_id="j" * 64, owner="acme", creator="acme", spec=spec, queued_at=datetime.now(UTC)
    )
    assert len(queued.to_bytes()) < NATS_MAX_PAYLOAD // 8


def test_a_spec_over_the_cap_is_refused_with_field_spec_and_its_rule() -> None:
    data = padded(limits.SPEC_BYTES + 1)
    spec = {k: v for k, v in data.items() if k not in BASE}
    rule, valid = refused(**spec)["spec"]
    assert rule == "limit:spec_bytes" and valid == f"at most {limits.SPEC_BYTES} bytes of JSON"


def test_a_spec_padded_to_just_under_the_nats_payload_is_refused() -> None:
    """The case of the issue: ~1 MiB of arguments, each within its own cap."""
    arg = "a" * limits.ARG_CHARS
    command = [arg] * (NATS_MAX_PAYLOAD // limits.ARG_CHARS - 8)
    assert len(command) <= limits.COMMAND_ARGS
    assert refused(command=command)["spec"][0] == "limit:spec_bytes"


def many(n: int, item: Any) -> list[Any]:
    return [item(i) if callable(item) else item for i in range(n)]


CAPS: list[tuple[str, int, Any, dict[str, Any], str]] = [
    # (limit, cap, a spec field's value of `cap + 1` items, other fields, refused field)
    (
        "datasets",
        limits.DATASETS,
        lambda n: {"datasets": many(n, lambda i: {"name": f"d{i}"})},
        {},
        "spec.datasets",
    ),
    (
        "checkpoints",
        limits.CHECKPOINTS,
        lambda n: {"checkpoints": many(n, lambda i: {"name": f"c{i}"})},
        {},
        "spec.checkpoints",
    ),
    (
        "env_vars",
        limits.ENV_VARS,
        lambda n: {"env": {f"V{i}": "" for i in range(n)}},
        {},
        "spec.env",
    ),
    (
        "env_value_chars",
        limits.ENV_VALUE_CHARS,
        lambda n: {"env": {"A": "x" * n}},
        {},
        "spec.env.A",
    ),
    ("command_args", limits.COMMAND_ARGS, lambda n: {"command": ["a"] * n}, {}, "spec.command"),
    ("arg_chars", limits.ARG_CHARS, lambda n: {"command": ["a" * n]}, {}, "spec.command.0"),
    (
        "worker_commands",
        limits.WORKERS,
        lambda n: {"worker_commands": [["a"]] * n, "workers": min(n, limits.WORKERS)},
        {"command": []},
        "spec.worker_commands",
    ),
    (
        "routes",
        limits.ROUTES,
        lambda n: {"endpoint": {"routes": many(n, lambda i: {**ROUTE, "path": f"/p{i}"})}},
        ENDPOINT,
        "spec.endpoint.routes",
    ),
    (
        "route_params",
        limits.ROUTE_PARAMS,
        lambda n: {
            "endpoint": {
                "routes": [
                    {**ROUTE, "body": many(n, lambda i: {"name": f"p{i}", "type": "string"})}
                ]
            }
        },
        ENDPOINT,
        "spec.endpoint.routes.0.body",
    ),
    (
        "packages",
        limits.PACKAGES,
        lambda n: {"environment": {"packages": {"pip": many(n, lambda i: f"p{i}")}}},
        {},
        "spec.environment.packages.pip",
    ),
    (
        "package_chars",
        limits.PACKAGE_CHARS,
        lambda n: {"environment": {"packages": {"apt": ["p" * n]}}},
        {},
        "spec.environment.packages.apt.0",
    ),
    (
        "gpu_types",
        limits.GPU_TYPES,
        lambda n: {"gpu_types": ["T4"] * n},
        {},
        "spec.gpu_types",
    ),
]


@pytest.mark.parametrize(("name", "cap", "make", "other", "field"), CAPS, ids=[c[0] for c in CAPS])
def test_each_cap_takes_its_number_and_refuses_one_more(
    name: str, cap: int, make: Any, other: dict[str, Any], field: str
) -> None:
    JobSpec.model_validate({**BASE, **other, **make(cap)})
    rule, valid = refused(**other, **make(cap + 1))[field]
    assert rule == f"limit:{name}" and valid is not None and valid.startswith(f"at most {cap} ")


def test_a_long_environment_variable_name_is_refused() -> None:
    JobSpec.model_validate({**BASE, "env": {"A" * limits.ENV_NAME_CHARS: "1"}})
    rule, valid = refused(env={"A" * (limits.ENV_NAME_CHARS + 1): "1"})["spec.env"]
    assert rule == "R-JOB-7" and valid is not None and str(limits.ENV_NAME_CHARS) in valid


def test_start_worker_holds_the_same_caps() -> None:
    base = {
        "minion_id": "n1",
        "job_id": "j1",
        "job_name": "hello",
        "worker": 0,
        "command": ["true"],
        "gpu_indices": [0],
        "placement_id": "p1",
    }
    mount = {
        "target": "/opt/ml/input",
        "kind": "input",
        "source": {"kind": "web", "url": "https://x"},
    }
    StartWorker.model_validate({**base, "mounts": [mount] * limits.MOUNTS})
    for extra, field in [
        ({"mounts": [mount] * (limits.MOUNTS + 1)}, "mounts"),
        ({"command": ["a"] * (limits.COMMAND_ARGS + 1)}, "command"),
        ({"env": {f"V{i}": "" for i in range(limits.ENV_VARS + 1)}}, "env"),
    ]:
        with pytest.raises(ValidationError) as info:
            StartWorker.model_validate({**base, **extra})
        (error,) = field_errors(info.value, StartWorker)
        assert error.field == field and error.rule.startswith("limit:")
