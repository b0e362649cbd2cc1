"""The server of an endpoint job's routes (R-JOB-6), run inside the job's container.

It imports nothing of gpufleet and runs in the job's own Python (3.8 on), with the job's
fastapi, pydantic and uvicorn; importing this package itself needs none of them, so the node
agent can find its files (`PACKAGE_DIR`) to ship them into the container.
"""

from __future__ import annotations

import os

# Where the node agent puts the routes and the model code in the container: the defaults of
# `python -m gpufleet_endpoint`, unless these variables say otherwise (a worker run without a
# container has its own paths; the agent sets ML_MODEL_PATH for the model code either way).
ROUTES_FILE = "/opt/gpufleet/routes.json"
ROUTES_ENV = "GPUFLEET_ROUTES"
MODELS_DIR = "/opt/ml/models"
MODELS_ENV = "ML_MODEL_PATH"
PORT = 80

# Paths of gpufleet's own, never a route's (gpufleet_contracts.endpoints refuses such a route).
RESERVED_PREFIX = "/__gpufleet"
HEALTH_PATH = RESERVED_PREFIX + "/health"

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class StartError(Exception):
    """The server cannot start: its routes file, the model code or a route's function is not
    what the routes say. The message says which and why; its cause is set only when the model
    code itself failed (its traceback is then worth showing)."""
