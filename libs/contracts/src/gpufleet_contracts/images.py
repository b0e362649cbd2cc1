"""A job's customer image and the registry credential it is pulled with (R-JOB-7).

A job with `environment.image` runs in that image; the node pulls it from its registry. A
private registry's credential is an attached third-party key: `docker` (any registry that
takes a user name and password: Docker Hub, GAR, ECR, a local one) or `ngc` (NVIDIA's, whose
user name is always `$oauthtoken`). Its values come from the job creator's key store
(gpufleet_contracts.keys, `gpufleet key add docker`); for compatibility, a job whose creator
has no such key may still carry the values in its env, sealed at rest like every env value:

    keys: [docker]  env: {DOCKER_USERNAME: ..., DOCKER_PASSWORD: ...}
    keys: [ngc]     env: {NGC_API_KEY: ...}

The scheduler takes those values out of the worker's env (`split_registry_auth`) in any case,
and hands the credential (the stored key's first, else the env's) to the node in
StartWorker's sealed `registry_auth`: used for the pull only, never given to the job, never
in an event, a log or the stored spec. A stored `docker` key with a `registry` is used only
for images of that registry (`registry_of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

# The attached key types that are registry credentials, in the order they are looked for.
REGISTRY_KEYS: dict[str, tuple[str | None, str]] = {
    # key: (env name of the user name, or None for a fixed one; env name of the password)
    "docker": ("DOCKER_USERNAME", "DOCKER_PASSWORD"),
    "ngc": (None, "NGC_API_KEY"),
}
NGC_USERNAME = "$oauthtoken"
DEFAULT_REGISTRY = "docker.io"


def registry_of(image: str) -> str:
    """The registry host of an image reference, as podman reads it (no search registries:
    a short name is Docker Hub's)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DEFAULT_REGISTRY


class RegistryAuth(BaseModel):
    """A registry credential, for the pull of one worker's image (never shown)."""

    model_config = ConfigDict(frozen=True)

    username: str = Field(min_length=1, max_length=256)
    password: str = Field(min_length=1, max_length=8192, repr=False)


def split_registry_auth(
    env: Mapping[str, str], keys: Sequence[str], image: str | None
) -> tuple[dict[str, str], RegistryAuth | None]:
    """The worker's env without the registry credential's values, and that credential: of
    the first attached registry key whose values the env has; none without an image."""
    out = dict(env)
    if image is None:
        return out, None
    for key in keys:
        names = REGISTRY_KEYS.get(key)
        if names is None:
            continue
        user_name, password_name = names
        password = env.get(password_name)
        username = NGC_USERNAME if user_name is None else env.get(user_name)
        if not password or not username:
            continue
        for name in (user_name, password_name):
            if name is not None:
                out.pop(name, None)
        return out, RegistryAuth(username=username, password=password)
    return out, None
