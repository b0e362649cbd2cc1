"""A JobSpec from a file and command-line flags, validated before anything is sent."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from gpufleet_contracts import ErrorBody, ErrorReply, FieldError, error, invalid
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from pydantic import ValidationError

from .client import ServiceError

MESSAGE = "the job spec is not valid"

# JobSpec field -> the flag that sets it (shown next to refused fields).
FLAGS = {
    "name": "--name",
    "type": "--type",
    "project": "--project",
    "gpu_types": "--gpu-type",
    "gpu_count": "--gpu-count",
    "cpu_count": "--cpu-count",
    "max_price": "--max-price",
    "disk_size_gb": "--disk-size",
    "workers": "--workers",
    "command": "-- COMMAND",
    "env": "--env",
    "region": "--region",
    "datasets": "--dataset",
    "checkpoints": "--checkpoint",
    "model": "--model",
    "output_data": "--output",
    "allow_burst": "--allow-burst",
    "environment.image": "--image",
    "environment.keys": "--key",
    "environment.packages.pip": "--pip",
    "endpoint": "--server-command, or endpoint: in --file",
    "endpoint.health_path": "--health-path",
    "request_id": "--request-id",
}


def location(value: str | None, kind_key: str) -> dict[str, str] | None:
    """`TYPE:PATH` (e.g. `aws:s3://bucket/x`, `git:https://...`) as a spec mapping."""
    if value is None:
        return None
    kind, sep, path = value.partition(":")
    if not sep:
        return {kind_key: value, "path": ""}  # refused by the spec, naming the field
    return {kind_key: kind, "path": path}


def integer(value: str | None) -> int | str | None:
    """An integer flag as a number: the spec takes JSON numbers, never "2". Anything else
    stays as given, for the spec to read (`--gpu-count 0.5`) or refuse, naming the field."""
    if value is not None and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        return int(value)
    return value


def named(values: list[str] | None) -> list[dict[str, str]] | None:
    return [{"name": v} for v in values] if values else None


def _refused(reply: ErrorReply) -> ServiceError:
    return ServiceError(reply.model_dump(mode="json"))


def load_file(path: Path) -> dict[str, Any]:
    """A spec mapping from YAML or JSON (`{"spec": {...}}` is accepted too)."""
    try:
        raw = path.read_text()
    except OSError as exc:
        raise _refused(error("invalid", f"cannot read {path}: {exc.strerror}")) from exc
    import yaml  # only a command given a spec file reads one

    try:
        data = json.loads(raw) if path.suffix.lower() == ".json" else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise _refused(error("invalid", f"{path} is not valid YAML/JSON: {exc}")) from exc
    if isinstance(data, dict) and set(data) == {"spec"} and isinstance(data["spec"], dict):
        data = data["spec"]
    if not isinstance(data, dict):
        raise _refused(error("invalid", f"{path} must hold a mapping of job spec fields"))
    return {str(k): v for k, v in data.items()}


def parse_env(pairs: list[str]) -> tuple[dict[str, str], list[FieldError]]:
    """KEY=VALUE pairs, and an R-JOB-7 error for each pair without '='."""
    env: dict[str, str] = {}
    bad: list[FieldError] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if sep:
            env[key] = value
        else:
            bad.append(
                FieldError(
                    field="env",
                    rule="R-JOB-7",
                    valid="KEY=VALUE",
                    message=f"expected KEY=VALUE, got {pair!r}",
                )
            )
    return env, bad


def environment(
    base: Any, image: str | None, keys: list[str] | None, pip: list[str] | None
) -> dict[str, Any] | None:
    """The file's `environment` with `--image`, `--key` and `--pip` over it (None: no change)."""
    if image is None and not keys and not pip:
        return None
    out = dict(base) if isinstance(base, dict) else {}
    if image is not None:
        out["image"] = image
    if keys:
        out["keys"] = list(keys)
    if pip:
        packages = out.get("packages")
        out["packages"] = {**(packages if isinstance(packages, dict) else {}), "pip": list(pip)}
    return out


def endpoint(
    base: Any, server_command: str | None, health_path: str | None = None
) -> dict[str, Any] | None:
    """The file's `endpoint` with `--server-command` in place of its way of serving (its
    routes), split as a shell would, and `--health-path` in place of its own (None: no
    change)."""
    if server_command is None and health_path is None:
        return None
    out = dict(base) if isinstance(base, dict) else {}
    if server_command is not None:
        out.pop("routes", None)
        try:
            out["server_command"] = shlex.split(server_command)
        except ValueError as exc:
            raise _refused(error("invalid", f"--server-command: {exc}")) from exc
    if health_path is not None:
        out["health_path"] = health_path
    return out


def build(base: dict[str, Any], flags: dict[str, Any], env_pairs: list[str]) -> JobSpec:
    """`base` (from a file) overridden by the flags that were given; env is merged by key."""
    data = dict(base)
    data.update({k: v for k, v in flags.items() if v is not None and v != []})
    env, env_errors = parse_env(env_pairs)
    if env:
        file_env = data.get("env")
        data["env"] = {**(file_env if isinstance(file_env, dict) else {}), **env}
    try:
        job_spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        reply = invalid(MESSAGE, exc, JobSpec)
        # A rule of the whole spec (its size, its regions) names it as the scheduler does.
        fields = [
            f.model_copy(update={"field": "spec"}) if f.field == "(message)" else f
            for f in reply.error.fields
        ]
        fields.extend(env_errors)
        raise _refused(ErrorReply(error=reply.error.model_copy(update={"fields": fields}))) from exc
    if env_errors:
        raise _refused(
            ErrorReply(error=ErrorBody(code="invalid", message=MESSAGE, fields=env_errors))
        )
    return job_spec


def submission(job_spec: JobSpec, request_id: str) -> SubmitJob:
    """The SubmitJob to send; a request id that is not valid is refused here, naming
    `--request-id`."""
    try:
        return SubmitJob(spec=job_spec, request_id=request_id)
    except ValidationError as exc:
        raise _refused(invalid("the request id is not valid", exc, SubmitJob)) from exc
