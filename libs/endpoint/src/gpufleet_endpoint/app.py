"""The FastAPI app: gpufleet's health route, and one POST route per declared route, which
calls its function with the request body's parameters.

FastAPI evaluates the annotations of the functions it serves, in the job's Python (3.8 on):
this module's are typing's, never strings (no `from __future__ import annotations`).
"""

import functools
import inspect
import logging
import re
from typing import Any, Callable, Dict, Optional, Sequence, Type

from fastapi import Body, FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from . import HEALTH_PATH, RESERVED_PREFIX, body
from .loader import Loader
from .routes import RouteDef

log = logging.getLogger("gpufleet_endpoint")


def build(routes: Sequence[RouteDef], models_dir: str) -> FastAPI:
    """The app of `routes`, their functions imported from `models_dir` (StartError if one
    cannot be)."""
    loader = Loader(models_dir)
    app = FastAPI(
        title="gpufleet endpoint",
        openapi_url=RESERVED_PREFIX + "/openapi.json",
        docs_url=RESERVED_PREFIX + "/docs",
        redoc_url=None,
    )
    app.add_api_route(
        HEALTH_PATH, health, methods=["GET"], include_in_schema=False, response_model=None
    )
    for i, route in enumerate(routes):
        fn = loader.function(route)
        model = body.model(route, f"Body{i}_" + re.sub(r"\W", "_", route.path).strip("_"))
        app.add_api_route(
            route.path,
            _endpoint(route, fn, model),
            methods=["POST"],
            name=f"{route.file}:{route.function}",
            response_model=None,
        )
    return app


async def health() -> Dict[str, str]:
    """Up once every route's function is imported: the server listens only then."""
    return {"status": "ok"}


def _endpoint(route: RouteDef, fn: Callable[..., Any], model: Type[Any]) -> Callable[..., Any]:
    names = [body.field_name(i) for i in range(len(route.body))]
    floats = {n for n, p in zip(names, route.body) if p.type == "float"}
    is_async = inspect.iscoroutinefunction(fn)

    async def endpoint(gpufleet_body: Any) -> Any:
        if gpufleet_body is None:  # no body, and no parameter is required: every default
            gpufleet_body = model()
        values = [getattr(gpufleet_body, n) for n in names]
        values = [body.as_float(v) if n in floats else v for n, v in zip(names, values)]
        if route.positional:
            call = functools.partial(fn, *values)
        else:
            call = functools.partial(fn, **{p.name: v for p, v in zip(route.body, values)})
        try:
            result = await call() if is_async else await run_in_threadpool(call)
            if inspect.isawaitable(result):
                result = await result
        except HTTPException:  # the function's own status code, answered as FastAPI does
            raise
        except Exception as exc:
            log.exception("POST %s: %s:%s raised", route.path, route.file, route.function)
            return _error(exc, "")
        if isinstance(result, Response):
            return result
        try:
            return JSONResponse(jsonable_encoder(result))
        except Exception as exc:
            log.exception("POST %s: the result of %s is not JSON", route.path, route.function)
            return _error(exc, "the function's result is not JSON: ")

    # FastAPI reads the body's model from the signature; with no required parameter the body
    # may be left out.
    required = any(not p.optional for p in route.body)
    annotation = model if required else Optional[model]
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "gpufleet_body",  # a name no route's path parameter takes
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=annotation,
                default=Body(...) if required else Body(None),
            )
        ]
    )
    return endpoint


def _error(exc: Exception, what: str) -> JSONResponse:
    message = str(exc)
    detail = f"{what}{type(exc).__name__}" + (f": {message}" if message else "")
    return JSONResponse({"detail": detail}, status_code=500)
