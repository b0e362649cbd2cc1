"""The route server's package as it must be to run in a job's container, and the contract's
side of its reserved paths."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gpufleet_endpoint
import pytest
from gpufleet_contracts.endpoints import RESERVED_PREFIX, Route
from pydantic import ValidationError

SOURCES = sorted(Path(gpufleet_endpoint.PACKAGE_DIR).glob("*.py"))
# What a job's image has for it (R-JOB-7), besides Python's own modules.
ALLOWED = {"fastapi", "starlette", "pydantic", "uvicorn"}


def test_the_sources_are_found() -> None:
    assert {p.name for p in SOURCES} >= {"__init__.py", "__main__.py", "app.py", "routes.py"}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_it_imports_only_python_and_the_images_server_packages(source: Path) -> None:
    tree = ast.parse(source.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert imported - ALLOWED <= sys.stdlib_module_names, imported - ALLOWED


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_it_is_python_3_8_syntax(source: Path) -> None:
    ast.parse(source.read_text(), feature_version=(3, 8))


def test_importing_the_package_needs_no_server_package() -> None:
    """The node agent finds the files to ship (PACKAGE_DIR) without fastapi."""
    code = (
        "import sys, gpufleet_endpoint; "
        "print(sorted(m for m in ('fastapi', 'pydantic', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


def test_the_contract_and_the_server_reserve_the_same_prefix() -> None:
    assert RESERVED_PREFIX == gpufleet_endpoint.RESERVED_PREFIX
    assert gpufleet_endpoint.HEALTH_PATH.startswith(RESERVED_PREFIX + "/")


@pytest.mark.parametrize("path", ["/__gpufleet", "/__gpufleet/", "/__gpufleet/health"])
def test_the_contract_refuses_a_route_under_the_reserved_prefix(path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Route(path=path, file="m.py", function="f")
    [error] = caught.value.errors()
    assert (error["loc"], error["type"]) == (("path",), "route_reserved")


@pytest.mark.parametrize("path", ["/__gpufleetx", "/a/__gpufleet/health", "/gpufleet", "/"])
def test_the_contract_keeps_paths_outside_the_reserved_prefix(path: str) -> None:
    assert Route(path=path, file="m.py", function="f").path == path
