"""Model code and routes for the route server's tests: routes are written as the contract
dumps them (`Route.model_dump(mode="json")`), the form the node agent hands over."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.endpoints import Route


def route(path: str, file: str, function: str, *params: Any, **kw: Any) -> dict[str, Any]:
    """A route as the contract dumps it; a param is (name, type) or (name, type, default)."""
    body = [
        {"name": p[0], "type": p[1]}
        if len(p) == 2
        else {"name": p[0], "type": p[1], "optional": True, "default": p[2]}
        for p in params
    ]
    dumped: dict[str, Any] = Route.model_validate(
        {"path": path, "file": file, "function": function, "body": body, **kw}
    ).model_dump(mode="json")
    return dumped


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _isolated_imports(tmp_path: Path) -> Iterator[None]:
    """The server puts the model code on sys.path and its modules in sys.modules: each test's
    model code is its own (another test's `helpers` is not this one's)."""
    path = list(sys.path)
    yield
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if name.startswith("_gpufleet_route_") or file.startswith(str(tmp_path)):
            del sys.modules[name]
