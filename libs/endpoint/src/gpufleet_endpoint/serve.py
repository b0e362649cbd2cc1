"""`python -m gpufleet_endpoint`: read the routes, import their functions, serve them with
uvicorn on a port or a unix socket; a start error is one line on stderr and exit status 1."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import Sequence

from . import HEALTH_PATH, MODELS_DIR, MODELS_ENV, PORT, ROUTES_ENV, ROUTES_FILE, StartError


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet_endpoint", description="Serve an endpoint job's routes."
    )
    parser.add_argument(
        "--routes",
        default=os.environ.get(ROUTES_ENV) or ROUTES_FILE,
        help=f"the routes' JSON (${ROUTES_ENV}, else {ROUTES_FILE})",
    )
    parser.add_argument(
        "--models",
        default=os.environ.get(MODELS_ENV) or MODELS_DIR,
        help=f"the model code (${MODELS_ENV}, else {MODELS_DIR})",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0)")
    parser.add_argument("--port", type=int, default=PORT, help=f"TCP port ({PORT})")
    parser.add_argument("--uds", default=None, help="listen on this unix socket instead")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        import uvicorn

        from . import app, routes  # fastapi, pydantic and uvicorn: the job image's

        served = app.build(routes.read(args.routes), args.models)
    except StartError as exc:
        if exc.__cause__ is not None:  # the model code's own error: its traceback
            traceback.print_exception(
                type(exc.__cause__), exc.__cause__, exc.__cause__.__traceback__
            )
        print(f"gpufleet_endpoint: cannot start: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"gpufleet_endpoint: cannot start: {exc} (an endpoint's image needs fastapi, "
            "pydantic, uvicorn[standard] and python-multipart)",
            file=sys.stderr,
        )
        return 1
    if args.uds:
        config = uvicorn.Config(served, uds=args.uds, log_level="info")
    else:
        config = uvicorn.Config(served, host=args.host, port=args.port, log_level="info")
    # After uvicorn has set its loggers up: the readiness probes stay out of the job's log.
    logging.getLogger("uvicorn.access").addFilter(_not_health)
    uvicorn.Server(config).run()
    return 0


def _not_health(record: logging.LogRecord) -> bool:
    args = record.args
    return not (isinstance(args, tuple) and len(args) > 2 and str(args[2]).startswith(HEALTH_PATH))
