"""Which secrets a worker gets of its job's attached keys (keyuse.py, R-JOB-7): plain data."""

from __future__ import annotations

from typing import Any

from gpufleet_contracts.images import RegistryAuth
from gpufleet_contracts.jobs import JobSpec
from gpufleet_scheduler.keyuse import in_env, refusal, resolve, unattached

HF = {"token": "hf-value"}
DOCKER = {"username": "me", "password": "pw-value"}


def spec(keys: list[str], image: str | None = None, env: dict[str, str] | None = None) -> JobSpec:
    environment: dict[str, Any] = {"keys": keys}
    if image is not None:
        environment["image"] = image
    return JobSpec.model_validate(
        {
            "name": "j",
            "gpu_types": ["RTX 3090"],
            "command": ["true"],
            "environment": environment,
            "env": env or {},
        }
    )


def test_a_stored_key_goes_to_the_worker_and_a_registry_key_to_the_pull_only() -> None:
    got = resolve(
        spec(["huggingface", "docker"], image="reg.example:5000/team/app:1", env={"A": "1"}),
        {"huggingface": HF, "docker": DOCKER, "wandb": {"api_key": "not named"}},
    )
    assert got.attached == {"huggingface": HF}  # not docker, not the unnamed wandb
    assert got.registry_auth == RegistryAuth(username="me", password="pw-value")
    assert got.env == {"A": "1"}
    assert got.any


def test_a_registry_key_bound_to_another_registry_is_not_sent() -> None:
    bound = {**DOCKER, "registry": "ghcr.io"}
    other = resolve(spec(["docker"], image="docker.io/a/b:1"), {"docker": bound})
    assert other.registry_auth is None
    ok = resolve(spec(["docker"], image="ghcr.io/a/b:1"), {"docker": bound})
    assert ok.registry_auth is not None


def test_an_ngc_key_is_for_nvcr_io_alone() -> None:
    ngc = {"ngc": {"api_key": "ngc-value"}}
    assert resolve(spec(["ngc"], image="docker.io/a/b:1"), ngc).registry_auth is None
    auth = resolve(spec(["ngc"], image="nvcr.io/nvidia/pytorch:24.01-py3"), ngc).registry_auth
    assert auth == RegistryAuth(username="$oauthtoken", password="ngc-value")


def test_without_an_image_no_credential_is_made() -> None:
    got = resolve(spec(["docker"]), {"docker": DOCKER})
    assert got.registry_auth is None and got.attached == {}
    assert not got.any


def test_env_values_of_a_registry_key_still_serve_and_never_reach_the_job() -> None:
    env = {"DOCKER_USERNAME": "old", "DOCKER_PASSWORD": "old-pw", "X": "y"}
    old_way = resolve(spec(["docker"], image="a/b:1", env=env), {})
    assert old_way.registry_auth == RegistryAuth(username="old", password="old-pw")
    assert old_way.env == {"X": "y"}
    # a stored key wins; the env's values still leave the env
    both = resolve(spec(["docker"], image="a/b:1", env=env), {"docker": DOCKER})
    assert both.registry_auth == RegistryAuth(username="me", password="pw-value")
    assert both.env == {"X": "y"}


def test_a_key_is_missing_unless_stored_or_a_registry_key_carried_in_env() -> None:
    env = {"NGC_API_KEY": "x"}
    assert in_env("ngc", env) and not in_env("huggingface", {"HF_TOKEN": "x"})
    assert unattached(["huggingface", "ngc", "docker"], {"docker"}, env) == ["huggingface"]
    assert unattached(["docker"], set(), {"DOCKER_PASSWORD": "p"}) == ["docker"]  # no user


def test_the_refusal_names_the_field_and_the_rule() -> None:
    err = refusal("acme", ["huggingface"], {"docker"}).reply.error
    assert err.code == "invalid"
    assert [(f.field, f.rule) for f in err.fields] == [("spec.environment.keys", "R-JOB-7")]
    assert "gpufleet key add huggingface" in (err.fields[0].valid or "")
    assert "docker" in (err.fields[0].valid or "")
