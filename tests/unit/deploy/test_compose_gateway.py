"""The compose stack's web console: the gateway runs on the services' image with the pages and
uPlot in it, on an identity of its own that `just compose-secrets` issues as `just up` does,
with nothing in its environment that would let it act for an account, and its port
published where the CLI's sign-in link points.

No Docker engine here: docker-compose.yml and deploy/Dockerfile are read as compose and
Docker read them (files.py), and the gateway's own settings are parsed from what they say."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from gpufleet_auth import Creds, permissions
from gpufleet_cli.console import DEFAULT_URL
from gpufleet_devstack.compose_secrets import generate
from gpufleet_gateway.app import web_dir
from gpufleet_gateway.settings import GatewaySettings

from .files import ROOT, built_stage, environment, load_compose, service, stages

OPERATOR_ENV = {"GPUFLEET_NATS_JETSTREAM_KEY": "k" * 64, "GPUFLEET_SECRET_KEY": "s" * 44}
GATEWAY = "gateway"
NATS = ("nats-1", "nats-2", "nats-3")


@pytest.fixture
def model() -> dict[str, Any]:
    return load_compose(env=OPERATOR_ENV)


def settings_in(svc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> GatewaySettings:
    """The settings the gateway starts with in that container (its environment only)."""
    for name in [n for n in os.environ if n.startswith("GPUFLEET_")]:
        monkeypatch.delenv(name)
    for name, value in environment(svc).items():
        monkeypatch.setenv(name, value)
    return GatewaySettings()


def test_the_gateway_runs_on_the_services_image_with_its_own_credential(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = service(model, GATEWAY)
    assert svc["command"] == ["gpufleet_gateway"]
    assert built_stage(svc).name == "runtime"  # uid 10001, no capability (node agent test)
    assert sorted(svc["secrets"]) == ["gateway-creds", "nats-ca"]
    assert model["secrets"]["gateway-creds"]["file"] == "./deploy/secrets/gateway.creds"
    settings = settings_in(svc, monkeypatch)
    assert settings.nats_creds == Path("/run/secrets/gateway-creds")
    assert settings.nats_ca == Path("/run/secrets/nats-ca")
    services_nats = environment(service(model, "scheduler"))["GPUFLEET_NATS_URL"]
    assert settings.servers == services_nats.split(",")  # the three servers, over TLS
    others = {n for n, s in model["services"].items() if "gateway-creds" in s.get("secrets", [])}
    assert others == {GATEWAY}


def test_the_gateways_environment_is_its_settings_only(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No account to act for, no MongoDB, no sealing key: each person's requests go on that
    person's credential (gateway/README.md, "How the gateway acts for a person")."""
    env = environment(service(model, GATEWAY))
    known = {f"GPUFLEET_{name.upper()}" for name in GatewaySettings.model_fields}
    assert {name for name in env if name.startswith("GPUFLEET_")} <= known
    for name in ("GPUFLEET_ACCOUNT", "GPUFLEET_MONGO_URL", "GPUFLEET_SECRET_KEY"):
        assert name not in env
    assert not any("account" in name.lower() for name in env)


def test_the_console_port_is_published_where_the_cli_links_to(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = service(model, GATEWAY)
    settings = settings_in(svc, monkeypatch)
    assert settings.console_host == "0.0.0.0"  # in its container: the published port decides
    port = settings.console_port
    assert svc["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert f"http://127.0.0.1:{port}" == DEFAULT_URL  # `gpufleet console login`'s link
    assert settings.console_secure_cookie is False  # plain HTTP, until a TLS proxy is put in
    behind_tls = {**OPERATOR_ENV, "GPUFLEET_BIND_ADDRESS": "0.0.0.0"}
    behind_tls["GPUFLEET_CONSOLE_SECURE_COOKIE"] = "true"
    exposed = service(load_compose(env=behind_tls), GATEWAY)
    assert exposed["ports"] == [f"0.0.0.0:{port}:{port}"]
    assert settings_in(exposed, monkeypatch).console_secure_cookie is True


def test_the_gateway_starts_once_nats_is_up_and_needs_no_mongodb(model: dict[str, Any]) -> None:
    depends = service(model, GATEWAY)["depends_on"]
    for name in NATS:
        assert depends[name] == {"condition": "service_healthy"}
    assert "mongo-init" not in depends


def test_the_image_holds_the_pages_and_uplot_where_the_gateway_serves_them(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = service(model, GATEWAY)
    web = PurePosixPath(str(web_dir(settings_in(svc, monkeypatch))))
    all_stages = stages()
    build, runtime, npm = all_stages["build"], built_stage(svc), all_stages["web"]
    # the pages: gateway/ (web/static in it) into /app, and /app into the runtime stage
    assert ("gateway/", "gateway/") in build.copies
    assert web == PurePosixPath(build.workdir) / "gateway" / "web"
    assert ("/app", "/app") in runtime.copies
    # uPlot: `npm ci` from the lock file in the web stage, its dist/ where /vendor/ is served
    assert npm.base.startswith("node:")
    assert any(run.startswith("npm ci") for run in npm.runs)
    for name in ("package.json", "package-lock.json"):
        assert (f"gateway/web/{name}", "./") in npm.copies
    dist = PurePosixPath(npm.workdir) / "node_modules" / "uplot" / "dist"
    assert (str(dist), str(web / "node_modules" / "uplot" / "dist")) in runtime.copies
    # no node in the services' image: the web stage's copy is uPlot's files only
    assert not any(run.startswith("npm") for run in runtime.runs)
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!gateway" in ignore  # sent to the build
    assert "**/node_modules" in ignore  # a developer's npm install is not: the lock file's is


def test_compose_secrets_issue_the_gateways_identity_as_just_up_does(
    model: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "secrets"
    made = generate(out)
    creds = Creds.read(out / "gateway.creds")
    assert creds.kind == "gateway"
    assert creds.claims["name"] == "gateway:console"  # gpufleet_devstack: issuer.gateway()
    nats = creds.claims["nats"]
    assert isinstance(nats, dict)
    assert nats["pub"] == {"allow": list(permissions.GATEWAY.pub)}
    # every credential and certificate compose mounts as a secret is one it writes
    for name, secret in model["secrets"].items():
        assert (out / Path(secret["file"]).name).is_file(), name
    assert out / "gateway.creds" in made
    assert generate(out) == []  # kept on a second run
