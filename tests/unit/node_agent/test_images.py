"""A job's image (R-JOB-7): the pull's argv and auth file, the disk check, and how the
scheduler takes a registry key's values out of the worker's env."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from gpufleet_contracts.images import RegistryAuth, split_registry_auth
from gpufleet_node_agent.images import (
    auth_json,
    pull_argv,
    qualified,
    registry_of,
    size_argv,
    too_big,
    write_auth_file,
)
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig, container_spec
from gpufleet_node_agent.worker.spec import WorkerSpec


def test_the_registry_of_an_image_reference() -> None:
    assert registry_of("127.0.0.1:5000/team/app:1") == "127.0.0.1:5000"
    assert registry_of("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io"
    assert registry_of("localhost/gpufleet/base:bookworm") == "localhost"
    assert registry_of("team/app:1") == "docker.io"
    assert registry_of("python:3.11") == "docker.io"
    assert qualified("python:3.11") == "docker.io/library/python:3.11"
    assert qualified("team/app:1") == "docker.io/team/app:1"
    assert qualified("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io/nvidia/pytorch:24.01-py3"


def test_the_pull_argv_always_has_an_auth_file_and_skips_tls_only_when_declared() -> None:
    auth = Path("/w/registry-auth.json")
    secure = pull_argv("nvcr.io/nvidia/pytorch:24.01-py3", authfile=auth)
    assert secure == [
        "podman",
        "pull",
        "--quiet",
        "--authfile",
        str(auth),
        "nvcr.io/nvidia/pytorch:24.01-py3",
    ]
    local = pull_argv("127.0.0.1:5000/team/app:1", authfile=auth, insecure=["127.0.0.1:5000"])
    assert local[-2:] == ["--tls-verify=false", "127.0.0.1:5000/team/app:1"]
    other = pull_argv("127.0.0.1:5001/team/app:1", authfile=auth, insecure=["127.0.0.1:5000"])
    assert "--tls-verify=false" not in other
    assert size_argv("team/app:1") == [
        "podman",
        "image",
        "inspect",
        "--format",
        "{{.Size}}",
        "docker.io/team/app:1",
    ]


def test_the_auth_file_is_0600_and_holds_only_that_registry(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    write_auth_file(path, "127.0.0.1:5000", {"username": "u", "password": "p:w"})
    assert path.stat().st_mode & 0o777 == 0o600
    data = json.loads(path.read_text())
    assert list(data["auths"]) == ["127.0.0.1:5000"]
    assert base64.b64decode(data["auths"]["127.0.0.1:5000"]["auth"]) == b"u:p:w"
    assert auth_json("docker.io", None) == {"auths": {}}  # never the node's own logins


def test_an_image_must_fit_the_disk() -> None:
    assert too_big(10**9, 1) is None
    assert too_big(1_350_000_000, 1) == "image of 1.4 GB does not fit disk_size_gb 1"
    assert too_big(216_000_000, 0) == "image of 0.3 GB does not fit disk_size_gb 0"


def test_the_container_runs_the_jobs_image_else_the_base_image(tmp_path: Path) -> None:
    spec = WorkerSpec(job_id="j", worker=0, placement_id="p", command=("true",))
    config = PodmanConfig(image="gpufleet/base:bookworm")
    assert container_spec(spec, tmp_path, "m", config).image == "gpufleet/base:bookworm"
    own = spec.model_copy(update={"image": "127.0.0.1:5000/team/app:1"})
    assert container_spec(own, tmp_path, "m", config).image == "127.0.0.1:5000/team/app:1"


def test_a_registry_key_leaves_the_workers_env_for_the_pull() -> None:
    env = {"DOCKER_USERNAME": "u", "DOCKER_PASSWORD": "p", "OTHER": "x"}
    rest, auth = split_registry_auth(env, ["wandb", "docker"], "127.0.0.1:5000/a:1")
    assert rest == {"OTHER": "x"}
    assert auth == RegistryAuth(username="u", password="p")
    assert "p" not in repr(auth).split("username")[1].replace("'u'", "")
    # NGC: the user name is always $oauthtoken
    rest, auth = split_registry_auth({"NGC_API_KEY": "k"}, ["ngc"], "nvcr.io/nvidia/x:1")
    assert (rest, auth) == ({}, RegistryAuth(username="$oauthtoken", password="k"))
    # no image, no key attached, or no values: the env is the worker's, as it came
    assert split_registry_auth(env, ["docker"], None) == (env, None)
    assert split_registry_auth(env, [], "a:1") == (env, None)
    assert split_registry_auth({"DOCKER_USERNAME": "u"}, ["docker"], "a:1") == (
        {"DOCKER_USERNAME": "u"},
        None,
    )
