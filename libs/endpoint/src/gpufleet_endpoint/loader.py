"""A route's function: its file found inside the model code (never outside it, symlinks
resolved), imported by path once, the function checked against the route's parameters."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
from typing import Any, Callable

from . import StartError
from .routes import RouteDef


class Loader:
    """Imports the route files of one model directory, each file once."""

    def __init__(self, models_dir: str) -> None:
        self.root = os.path.realpath(models_dir)
        if not os.path.isdir(self.root):
            raise StartError(f"the model code directory {models_dir} does not exist")
        self._modules: dict[str, Any] = {}
        # The model's own imports (`import utils`, `from pkg import x`) find its files first.
        if self.root in sys.path:
            sys.path.remove(self.root)
        sys.path.insert(0, self.root)

    def function(self, route: RouteDef) -> Callable[..., Any]:
        path = self.resolve(route.file)
        module = self._modules.get(path) or self._import(path, route.file)
        fn = getattr(module, route.function, None)
        if fn is None:
            raise StartError(f"route {route.path}: {route.file} has no {route.function!r}")
        if not callable(fn):
            raise StartError(f"route {route.path}: {route.file}:{route.function} is not callable")
        _check_call(route, fn)
        return fn  # type: ignore[no-any-return]

    def resolve(self, file: str) -> str:
        """`file`'s real path; refused unless it is a .py file inside the model code."""
        if os.path.isabs(file):
            raise StartError(f"route file {file!r} must be relative to the model code")
        path = os.path.realpath(os.path.join(self.root, file))
        if os.path.commonpath([self.root, path]) != self.root:
            raise StartError(
                f"route file {file!r} resolves to {path}, outside the model code {self.root}"
            )
        if not path.endswith(".py"):
            raise StartError(f"route file {file!r} resolves to {path}, not a .py file")
        if not os.path.isfile(path):
            raise StartError(f"route file {file!r} is not in the model code {self.root}")
        return path

    def _import(self, path: str, file: str) -> Any:
        # A name of its own, so that no file of the model shadows a module of Python's
        # (a `code.py`) or another route file; registered, as pickle and dataclasses expect.
        name = f"_gpufleet_route_{len(self._modules)}_" + re.sub(r"\W", "_", file[:-3])
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise StartError(f"route file {file!r} cannot be imported")
        module = importlib.util.module_from_spec(spec)
        here = os.path.dirname(path)
        if here not in sys.path:  # as when the file is run as a script, after the model root
            sys.path.insert(sys.path.index(self.root) + 1, here)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            del sys.modules[name]
            raise StartError(f"importing {file} failed: {type(exc).__name__}: {exc}") from exc
        self._modules[path] = module
        return module


def _check_call(route: RouteDef, fn: Callable[..., Any]) -> None:
    """Refused at start rather than at every request: a function the route's parameters
    cannot be passed to as the route says (positionally in order, or by name)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: found out at its first call
        return
    names = [p.name for p in route.body]
    try:
        if route.positional:
            signature.bind(*names)
        else:
            signature.bind(**dict.fromkeys(names))
    except TypeError as exc:
        how = "positionally" if route.positional else "by name"
        raise StartError(
            f"route {route.path}: {route.file}:{route.function} cannot take the body "
            f"parameters ({', '.join(names) or 'none'}) {how}: {exc}"
        ) from None
