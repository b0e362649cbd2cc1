"""The route server's app through FastAPI's TestClient: bodies typed as declared, functions
called positionally or by name, FastAPI's 422 and 405, a function's failure a 500."""

from __future__ import annotations

import importlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gpufleet_endpoint import HEALTH_PATH, RESERVED_PREFIX, app, routes

from .conftest import route, write

MODEL = """
    import asyncio

    from fastapi import HTTPException
    from fastapi.responses import PlainTextResponse

    from helpers import RELEASED, STARTED, twice

    def add(a, b):
        return a + b

    def scale(x, factor=99.0):
        return x * factor

    def ordered(x, y, z):
        return [x, y, z]

    def by_name(*, b, a):
        return {"a": a, "b": b}

    def kinds(s, i, f, b, o, l):
        return [type(v).__name__ for v in (s, i, f, b, o, l)]

    def fails(x):
        raise ValueError(f"bad x: {x}")

    def teapot():
        raise HTTPException(status_code=418, detail="short and stout")

    def not_json():
        return object()

    def text():
        return PlainTextResponse("plain")

    def appends(items, tag=None):
        items.append(tag)
        return items

    def doubled(n):
        return twice(n)

    def shadowing(json, _private, model_config):
        return [json, _private, model_config]

    def wait():
        STARTED.set()
        return RELEASED.wait(timeout=20)

    def release():
        RELEASED.set()

    async def echo(text):
        await asyncio.sleep(0)
        return {"echo": text}
"""

HELPERS = """
    import threading

    STARTED = threading.Event()
    RELEASED = threading.Event()

    def twice(n):
        return 2 * n
"""

ROUTES = [
    route("/add", "model.py", "add", ("a", "integer"), ("b", "integer")),
    route("/scale", "model.py", "scale", ("x", "float"), ("factor", "float", "2")),
    route(
        "/ordered",
        "model.py",
        "ordered",
        ("c", "string"),
        ("a", "string"),
        ("b", "string"),
        positional=True,
    ),
    route("/by-name", "model.py", "by_name", ("a", "integer"), ("b", "string")),
    route(
        "/kinds",
        "model.py",
        "kinds",
        ("s", "string"),
        ("i", "integer"),
        ("f", "float"),
        ("b", "boolean"),
        ("o", "object"),
        ("l", "list"),
        positional=True,
    ),
    route("/fails", "model.py", "fails", ("x", "integer")),
    route("/teapot", "model.py", "teapot"),
    route("/not-json", "model.py", "not_json"),
    route("/text", "model.py", "text"),
    route("/appends", "model.py", "appends", ("items", "list", "[]"), ("tag", "string", "None")),
    route("/doubled", "model.py", "doubled", ("n", "integer")),
    route(
        "/shadowing",
        "model.py",
        "shadowing",
        ("json", "integer"),
        ("_private", "integer"),
        ("model_config", "integer"),
    ),
    route("/wait", "model.py", "wait"),
    route("/release", "model.py", "release"),
    route("/echo", "model.py", "echo", ("text", "string")),
    route("/sub/predict", "sub/predict.py", "predict", ("x", "integer")),
]


@pytest.fixture
def client(models: Path) -> TestClient:
    write(
        models,
        {
            "model.py": MODEL,
            "helpers.py": HELPERS,
            # imports its neighbour as a script beside it would
            "sub/predict.py": "import neighbour\n\ndef predict(x):\n    return neighbour.f(x)\n",
            "sub/neighbour.py": "def f(x):\n    return x + 1000\n",
        },
    )
    return TestClient(app.build(routes.parse(ROUTES), str(models)))


def post(client: TestClient, path: str, body: Any = None) -> Any:
    response = client.post(path, json=body)
    return response.status_code, response.json()


def test_an_integer_sum(client: TestClient) -> None:
    assert post(client, "/add", {"a": 2, "b": 40}) == (200, 42)


def test_an_optional_parameter_left_out_takes_its_declared_default(client: TestClient) -> None:
    assert post(client, "/scale", {"x": 1.5}) == (200, 3.0)  # the route's 2, not the code's 99
    assert post(client, "/scale", {"x": 1.5, "factor": 3}) == (200, 4.5)


def test_positional_arguments_go_in_the_declared_order(client: TestClient) -> None:
    # declared c, a, b: the function's x, y, z, whatever the order of the JSON's keys
    assert post(client, "/ordered", {"a": "A", "b": "B", "c": "C"}) == (200, ["C", "A", "B"])


def test_keyword_arguments_go_by_name(client: TestClient) -> None:
    # the function takes keywords only, b before a
    assert post(client, "/by-name", {"b": "x", "a": 1}) == (200, {"a": 1, "b": "x"})


def test_each_declared_type_reaches_the_function_as_its_python_type(client: TestClient) -> None:
    body = {"s": "t", "i": 1, "f": 2, "b": True, "o": {"k": [1]}, "l": [1, "x"]}
    assert post(client, "/kinds", body) == (200, ["str", "int", "float", "bool", "dict", "list"])


@pytest.mark.parametrize(
    ("body", "field", "error"),
    [
        ({"a": 1}, "b", "missing"),
        ({"a": 1, "b": "2"}, "b", "int_type"),
        ({"a": 1, "b": 3.0}, "b", "int_type"),
        ({"a": 1, "b": True}, "b", "int_type"),
        ({"a": 1, "b": None}, "b", "int_type"),
        ({"a": 1, "b": 2, "c": 3}, "c", "extra_forbidden"),
    ],
)
def test_a_missing_wrong_or_unknown_parameter_is_a_422_naming_it(
    client: TestClient, body: dict[str, Any], field: str, error: str
) -> None:
    status, answer = post(client, "/add", body)
    assert status == 422
    assert [(e["loc"], e["type"]) for e in answer["detail"]] == [(["body", field], error)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("s", 3), ("f", "2.5"), ("b", 1), ("b", "true"), ("o", [1]), ("l", {"k": 1}), ("l", "ab")],
)
def test_json_values_are_taken_strictly(client: TestClient, field: str, value: Any) -> None:
    body = {"s": "t", "i": 1, "f": 2.5, "b": True, "o": {}, "l": [], field: value}
    status, answer = post(client, "/kinds", body)
    assert status == 422
    assert [e["loc"] for e in answer["detail"]] == [["body", field]]


def test_a_required_body_left_out_is_a_422(client: TestClient) -> None:
    response = client.post("/add")
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body"]


def test_a_body_of_optional_parameters_may_be_left_out(client: TestClient) -> None:
    assert client.post("/appends").json() == [None]


def test_a_default_changed_by_a_call_is_not_changed_for_the_next(client: TestClient) -> None:
    assert post(client, "/appends", {"tag": "a"}) == (200, ["a"])
    assert post(client, "/appends", {"tag": "b"}) == (200, ["b"])
    assert post(client, "/appends", {"items": [1], "tag": None}) == (200, [1, None])


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_only_post_is_served(client: TestClient, method: str) -> None:
    response = client.request(method, "/add", json={"a": 1, "b": 2})
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


def test_the_functions_exception_is_a_500_with_its_message_and_logged(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="gpufleet_endpoint"):
        assert post(client, "/fails", {"x": 7}) == (500, {"detail": "ValueError: bad x: 7"})
    [record] = [r for r in caplog.records if r.name == "gpufleet_endpoint"]
    assert "POST /fails" in record.getMessage()
    assert record.exc_info is not None and str(record.exc_info[1]) == "bad x: 7"
    assert "raise ValueError" in caplog.text  # the traceback, down to the user's line


def test_the_functions_own_http_exception_keeps_its_status(client: TestClient) -> None:
    assert post(client, "/teapot") == (418, {"detail": "short and stout"})


def test_a_result_that_is_not_json_is_a_500_saying_so(client: TestClient) -> None:
    status, answer = post(client, "/not-json")
    assert status == 500
    assert answer["detail"].startswith("the function's result is not JSON: ")


def test_a_response_returned_by_the_function_is_sent_as_it_is(client: TestClient) -> None:
    response = client.post("/text")
    assert (response.status_code, response.text) == (200, "plain")


def test_the_model_code_imports_its_own_modules(client: TestClient) -> None:
    assert post(client, "/doubled", {"n": 21}) == (200, 42)  # helpers.py at the model root
    assert post(client, "/sub/predict", {"x": 1}) == (200, 1001)  # sub/neighbour.py


def test_parameter_names_that_pydantic_uses_itself_are_plain_parameters(
    client: TestClient,
) -> None:
    body = {"json": 1, "_private": 2, "model_config": 3}
    assert post(client, "/shadowing", body) == (200, [1, 2, 3])
    status, answer = post(client, "/shadowing", {"json": 1, "_private": 2})
    assert status == 422 and answer["detail"][0]["loc"] == ["body", "model_config"]


def test_a_sync_function_that_waits_does_not_hold_up_other_requests(client: TestClient) -> None:
    with client, ThreadPoolExecutor(1) as pool:  # one event loop for all requests, as uvicorn
        waiting = pool.submit(client.post, "/wait")
        helpers = importlib.import_module("helpers")  # the model's, imported by model.py
        assert helpers.STARTED.wait(timeout=10)
        # On the event loop, /wait would hold this one up until its own timeout, then fail.
        assert client.post("/release").status_code == 200
        assert waiting.result(timeout=30).json() is True


def test_an_async_function_is_awaited(client: TestClient) -> None:
    assert post(client, "/echo", {"text": "hi"}) == (200, {"echo": "hi"})


def test_the_health_route(client: TestClient) -> None:
    response = client.get(HEALTH_PATH)
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert client.post(HEALTH_PATH).status_code == 405


def test_the_openapi_document_is_under_the_reserved_prefix(client: TestClient) -> None:
    document = client.get(RESERVED_PREFIX + "/openapi.json").json()
    assert HEALTH_PATH not in document["paths"]
    assert set(document["paths"]) == {r["path"] for r in ROUTES}
    assert client.get("/openapi.json").status_code == 404
    assert client.get("/docs").status_code == 404
