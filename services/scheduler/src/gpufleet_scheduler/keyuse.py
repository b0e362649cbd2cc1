"""What a worker gets of its job's attached keys (R-JOB-7), pure: no I/O.

A job names key types (`environment.keys`); their values are its **creator's** attached keys
(keystore.py): the account that submitted the job and whose command runs. Never the project
owner's: a member of another account's project would otherwise run code with the owner's
credentials.

- Registry keys (`docker`, `ngc`) become StartWorker's `registry_auth`, for the pull of the
  job's image only; the job never sees them. A stored `docker` key with a `registry` is used
  only for images of that registry, an `ngc` key only for `nvcr.io`: a credential is never
  sent to a registry it is not for. Without a stored key, the values the job carries in its
  env the old way (`DOCKER_USERNAME`/`DOCKER_PASSWORD`, `NGC_API_KEY`) still serve
  (gpufleet_contracts.images), and are taken out of the env in any case.
- Every other key goes to the worker alone (`attached`: StartWorker's `attached_keys`).
- A job naming a key type its creator has not attached (nor, for a registry key, carries in
  its env) is refused at submission (`unattached`, `refusal`: field `spec.environment.keys`,
  rule R-JOB-7). A key removed after the submission makes the job fail when it would be
  placed (commit.py), with the reason `missing_reason` gives.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet_contracts import FieldError
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.images import (
    NGC_USERNAME,
    REGISTRY_KEYS,
    RegistryAuth,
    registry_of,
    split_registry_auth,
)
from gpufleet_contracts.jobs import JobSpec

NGC_REGISTRY = "nvcr.io"
Stored = Mapping[str, Mapping[str, str]]  # an account's opened keys: type -> field -> value


@dataclass(frozen=True)
class WorkerSecrets:
    """A worker's secrets: its env (registry values out), its pull's credential, its keys."""

    env: dict[str, str]
    registry_auth: RegistryAuth | None = field(default=None, repr=False)
    attached: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)

    @property
    def any(self) -> bool:
        return bool(self.env or self.registry_auth or self.attached)


def in_env(key: str, env: Mapping[str, str]) -> bool:
    """Whether `env` carries the values of registry key `key` (the way before the store)."""
    names = REGISTRY_KEYS.get(key)
    if names is None:
        return False
    user, password = names
    return bool(env.get(password)) and (user is None or bool(env.get(user)))


def unattached(keys: Sequence[str], stored: Collection[str], env: Mapping[str, str]) -> list[str]:
    """The key types a job names that it cannot get: not attached to its creator's account
    and, for a registry key, not carried in its env either."""
    return [k for k in keys if k not in stored and not in_env(k, env)]


def refusal(account: str, missing: Sequence[str], stored: Collection[str]) -> Refused:
    have = ", ".join(sorted(stored)) or "none"
    return Refused(
        "invalid",
        f"key(s) {', '.join(missing)} not attached to account {account}",
        [
            FieldError(
                field="spec.environment.keys",
                rule="R-JOB-7",
                message=f"no {k} key is attached to account {account}",
                valid=f"attach it first (gpufleet key add {k}); attached: {have}",
            )
            for k in missing
        ],
    )


def missing_reason(missing: Sequence[str], account: str) -> str:
    return (
        f"attached key(s) {', '.join(missing)} of account {account} are gone (removed after "
        "the job was submitted, or sealed with another GPUFLEET_SECRET_KEY)"
    )


def serves(key: str, values: Mapping[str, str], image: str) -> bool:
    """Whether a stored registry key is for `image`'s registry."""
    registry = registry_of(image)
    if key == "ngc":
        return registry == NGC_REGISTRY
    bound = values.get("registry")
    return not bound or bound == registry


def registry_auth(key: str, values: Mapping[str, str]) -> RegistryAuth:
    if key == "ngc":
        return RegistryAuth(username=NGC_USERNAME, password=values["api_key"])
    return RegistryAuth(username=values["username"], password=values["password"])


def resolve(spec: JobSpec, stored: Stored) -> WorkerSecrets:
    """The secrets of a worker of `spec`, whose creator's attached keys are `stored`."""
    image = spec.environment.image
    env, from_env = split_registry_auth(spec.env, spec.environment.keys, image)
    auth: RegistryAuth | None = None
    attached: dict[str, dict[str, str]] = {}
    for key in spec.environment.keys:
        values = stored.get(key)
        if values is None:
            continue
        if key in REGISTRY_KEYS:
            if auth is None and image is not None and serves(key, values, image):
                auth = registry_auth(key, values)
        else:
            attached[key] = dict(values)
    return WorkerSecrets(env, auth or from_env, attached)
