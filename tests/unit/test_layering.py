"""Who may depend on whom, read from the source tree (no package is imported).

libs/      the runtime's shared code: imports no service, no CLI and no dev tool
services/  and cli/: the runtime; imports no dev tool
gateway/   the web console, an entrypoint: imports libs only (no service, CLI or dev tool)
devtools/  development only (the local stack, the docs generators, the GCP emulator):
           may import anything; nothing of the runtime imports it, and the production
           image neither copies nor installs it
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _packages(pattern: str) -> set[str]:
    """The import names of the packages under `<pattern>/src/`."""
    return {
        p.name
        for p in ROOT.glob(f"{pattern}/src/*")
        if p.is_dir() and (p / "__init__.py").is_file()
    }


def _imports(src: Path) -> set[tuple[str, str]]:
    """(file relative to the repository, top-level module) for every absolute import in any
    .py file under `src`, at module level or inside a function."""
    found: set[tuple[str, str]] = set()
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.add((str(path.relative_to(ROOT)), name.split(".")[0]))
    return found


LIBS = _packages("libs/*")
SERVICES = _packages("services/*")
CLI = _packages("cli")
GATEWAY = _packages("gateway")
DEVTOOLS = _packages("devtools/*")


def test_the_layers_are_found() -> None:
    assert {"gpufleet_contracts", "gpufleet_bus"} <= LIBS
    assert {"gpufleet_scheduler", "gpufleet_node_agent"} <= SERVICES
    assert "gpufleet_cli" in CLI
    assert {"gpufleet_gateway"} == GATEWAY
    assert {"gpufleet_devstack", "gpufleet_gcp_emulator"} <= DEVTOOLS
    assert not (LIBS & DEVTOOLS) and not (LIBS & SERVICES)


@pytest.mark.parametrize("lib", sorted(LIBS))
def test_a_lib_imports_no_service_cli_or_devtool(lib: str) -> None:
    src = next(ROOT.glob(f"libs/*/src/{lib}"))
    forbidden = SERVICES | CLI | DEVTOOLS
    wrong = sorted(f"{file}: {module}" for file, module in _imports(src) if module in forbidden)
    assert not wrong, f"a lib depends on a service, the CLI or a dev tool: {wrong}"


@pytest.mark.parametrize("package", sorted(SERVICES | CLI))
def test_the_runtime_imports_no_devtool(package: str) -> None:
    src = next(ROOT.glob(f"*/*/src/{package}"), None) or next(ROOT.glob(f"*/src/{package}"))
    wrong = sorted(f"{file}: {module}" for file, module in _imports(src) if module in DEVTOOLS)
    assert not wrong, f"the runtime imports development-only code: {wrong}"


def test_the_gateway_imports_libs_only() -> None:
    """It acts for people on their own credentials: it needs no service's code."""
    forbidden = SERVICES | CLI | DEVTOOLS
    wrong = sorted(
        f"{file}: {module}"
        for file, module in _imports(ROOT / "gateway" / "src" / "gpufleet_gateway")
        if module in forbidden
    )
    assert not wrong, f"the gateway depends on a service, the CLI or a dev tool: {wrong}"


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


def _devtool_distributions() -> set[str]:
    return {
        tomllib.loads(p.read_text())["project"]["name"]
        for p in ROOT.glob("devtools/*/pyproject.toml")
    }


def test_the_production_install_leaves_the_devtools_out() -> None:
    """The image runs `uv sync --no-dev`: the root's dependencies and every runtime member's
    must not pull a dev tool in (the root lists them in its `dev` group)."""
    devtools = _devtool_distributions()
    assert devtools >= {"gpufleet-devstack", "gpufleet-gcp-emulator"}
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert not _requirement_names(root["project"]["dependencies"]) & devtools
    assert devtools <= _requirement_names(root["dependency-groups"]["dev"])
    for member in [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]:
        deps = tomllib.loads(member.read_text())["project"].get("dependencies", [])
        assert not _requirement_names(deps) & devtools, member.relative_to(ROOT)
    cli = tomllib.loads((ROOT / "cli" / "pyproject.toml").read_text())["project"]
    assert not _requirement_names(cli.get("dependencies", [])) & devtools


def test_the_image_does_not_copy_the_devtools() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copies = [line for line in dockerfile.splitlines() if line.startswith(("COPY", "ADD"))]
    assert copies and not any("devtools" in line for line in copies)
    assert "--no-dev" in dockerfile
    ignore = [line.strip() for line in (ROOT / "deploy" / "Dockerfile.dockerignore").open()]
    assert "*" in ignore  # an allow-list: what is not named is not sent to the build
    assert not any(line.startswith("!devtools") for line in ignore)
