"""What the route server refuses at start, with a message on stderr and exit status 1: a
route file outside the model code (`..`, absolute, through a symlink), a missing or
unusable function, model code that fails to import, a bad routes file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from gpufleet_endpoint import StartError, app, routes, serve

from .conftest import route, write


def build(models: Path, *declared: dict[str, Any]) -> None:
    app.build(routes.parse(list(declared)), str(models))


def refused(models: Path, *declared: dict[str, Any]) -> str:
    with pytest.raises(StartError) as caught:
        build(models, *declared)
    return str(caught.value)


def plain(path: str, file: str, function: str = "f", **kw: Any) -> dict[str, Any]:
    """A route as the agent could write it, past the contract's checks (which refuse `..`)."""
    return {"verb": "POST", "path": path, "file": file, "function": function, "body": [], **kw}


def test_a_file_above_the_model_code_is_refused(models: Path) -> None:
    write(models.parent, {"evil.py": "def f():\n    return 'escaped'\n"})
    message = refused(models, plain("/p", "../evil.py"))
    assert "outside the model code" in message and "evil.py" in message


def test_an_absolute_file_is_refused_even_inside(models: Path) -> None:
    write(models, {"m.py": "def f():\n    pass\n"})
    assert "relative" in refused(models, plain("/p", str(models / "m.py")))


def test_a_symlink_out_of_the_model_code_is_refused(models: Path) -> None:
    write(models.parent, {"outside/evil.py": "def f():\n    return 'escaped'\n"})
    (models / "link.py").symlink_to(models.parent / "outside" / "evil.py")
    (models / "linked_dir").symlink_to(models.parent / "outside")
    assert "outside the model code" in refused(models, route("/a", "link.py", "f"))
    assert "outside the model code" in refused(models, route("/b", "linked_dir/evil.py", "f"))


def test_a_symlink_that_stays_inside_and_a_symlinked_model_dir_are_served(
    models: Path, tmp_path: Path
) -> None:
    write(models, {"real/m.py": "def f():\n    return 1\n"})
    (models / "alias.py").symlink_to(models / "real" / "m.py")
    (tmp_path / "models-link").symlink_to(models)
    app.build(routes.parse([route("/p", "alias.py", "f")]), str(tmp_path / "models-link"))


def test_a_missing_file_or_function_is_refused(models: Path) -> None:
    write(models, {"m.py": "def f():\n    pass\n\nVALUE = 3\n"})
    assert "not in the model code" in refused(models, route("/p", "gone.py", "f"))
    assert "has no 'predict'" in refused(models, route("/p", "m.py", "predict"))
    assert "not callable" in refused(models, route("/p", "m.py", "VALUE"))


@pytest.mark.parametrize(
    ("code", "positional", "why"),
    [
        ("def f(a):\n    pass\n", True, "too many positional arguments"),
        ("def f(a):\n    pass\n", False, "unexpected keyword argument 'b'"),
        ("def f(*, a, b):\n    pass\n", True, "too many positional arguments"),
        ("def f(a, b, c):\n    pass\n", False, "missing a required argument: 'c'"),
    ],
)
def test_a_function_that_cannot_take_the_body_as_the_route_says_is_refused(
    models: Path, code: str, positional: bool, why: str
) -> None:
    write(models, {"m.py": code})
    declared = route("/p", "m.py", "f", ("a", "integer"), ("b", "integer"), positional=positional)
    message = refused(models, declared)
    assert "cannot take the body parameters (a, b)" in message and why in message


def test_model_code_that_fails_to_import_is_refused_with_its_error(models: Path) -> None:
    write(models, {"m.py": "import no_such_module_here\n"})
    with pytest.raises(StartError, match=r"importing m\.py failed: ModuleNotFoundError") as caught:
        build(models, route("/p", "m.py", "f"))
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        ([], "non-empty JSON list"),
        ({"routes": []}, "non-empty JSON list"),
        ([plain("/__gpufleet/health", "m.py")], "gpufleet's own"),
        ([plain("/p", "m.py", verb="GET")], "only POST"),
        ([plain("/p", "m.py"), plain("/p", "m.py")], "two routes share POST /p"),
        ([plain("/p", "m.py", function="import")], "not a Python function name"),
        ([plain("/p", "m.py", body=[{"name": "a", "type": "int"}])], "type 'int'"),
        (
            [plain("/p", "m.py", body=[{"name": "a", "type": "integer", "optional": True}])],
            "needs a default",
        ),
        (
            [
                plain(
                    "/p",
                    "m.py",
                    body=[{"name": "a", "type": "integer", "optional": True, "default": "null"}],
                )
            ],
            "not a Python literal",
        ),
    ],
)
def test_a_bad_routes_file_is_refused(declared: Any, why: str) -> None:
    with pytest.raises(StartError, match=why):
        routes.parse(declared)


def test_main_exits_1_with_the_reason_on_stderr(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(models.parent, {"evil.py": "def f():\n    pass\n"})
    routes_file = tmp_path / "routes.json"
    routes_file.write_text(json.dumps([plain("/p", "../evil.py")]))
    assert serve.main(["--routes", str(routes_file), "--models", str(models)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpufleet_endpoint: cannot start: route file '../evil.py' resolves")
    assert "outside the model code" in err


def test_main_shows_the_model_codes_traceback_when_it_fails_to_import(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(models, {"m.py": "\n\nraise RuntimeError('weights missing')\n"})
    routes_file = tmp_path / "routes.json"
    routes_file.write_text(json.dumps([route("/p", "m.py", "f")]))
    assert serve.main(["--routes", str(routes_file), "--models", str(models)]) == 1
    err = capsys.readouterr().err
    assert f'File "{os.path.realpath(models / "m.py")}", line 3' in err
    assert err.splitlines()[-1] == (
        "gpufleet_endpoint: cannot start: importing m.py failed: RuntimeError: weights missing"
    )


def test_main_without_a_routes_file_says_so(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.json"
    assert serve.main(["--routes", str(missing), "--models", str(models)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpufleet_endpoint: cannot start: cannot read the routes file {missing}")
    assert "Traceback" not in err  # gpufleet's own refusal: one line, no traceback


def test_the_defaults_are_the_containers_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_ROUTES", raising=False)
    monkeypatch.delenv("ML_MODEL_PATH", raising=False)
    args = serve.arguments(["--port", "80"])
    assert (args.routes, args.models, args.host, args.port, args.uds) == (
        "/opt/gpufleet/routes.json",
        "/opt/ml/models",
        "0.0.0.0",
        80,
        None,
    )


def test_the_variables_move_the_defaults_and_the_arguments_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUFLEET_ROUTES", "/w/endpoint/routes.json")
    monkeypatch.setenv("ML_MODEL_PATH", "/w/mnt/opt/ml/models")
    args = serve.arguments([])
    assert (args.routes, args.models) == ("/w/endpoint/routes.json", "/w/mnt/opt/ml/models")
    args = serve.arguments(["--routes", "/r.json", "--models", "/m"])
    assert (args.routes, args.models) == ("/r.json", "/m")
