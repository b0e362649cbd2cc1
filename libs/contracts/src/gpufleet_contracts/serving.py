"""Endpoints served at a URL (R-JOB-6): what a node needs to serve a worker, and the API keys
that let a caller in.

A node that runs an endpoint's worker gets `Serving` in StartWorker: how the container
serves (the generated route server, the user's own server on port 80) and the path the
node's proxy probes before it lets requests through. The URL is the node's proxy's
(`RegisterNode.proxy_url`, a template with `{job}`), one origin per job.

Keys: an account creates, lists and revokes the keys of its own endpoints
(rpc.scheduler.<verb>.<account>; another account's endpoint is "not found"). A key is shown
once, at creation (`gfk_<key_id>_<secret>`); the scheduler keeps only the SHA-256 of its
secret. A node's proxy asks the scheduler (nrpc.scheduler.verify_endpoint_key.<minion_id>)
whether a presented key opens one of the endpoints it serves now, sending the key's id and
digest, never the key.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from . import limits, subjects
from .base import Command, Event
from .endpoints import RESERVED_PREFIX, Route
from .fields import Int, Name

KEY_PREFIX = "gfk_"
KEY_ID_CHARS = 12
KEY_NAME_CHARS = 64
KEYS_PER_ENDPOINT = 20
# `gfk_<12 hex>_<43 url-safe base64>`: what a caller sends as `Authorization: Bearer <key>`.
KEY_RE = re.compile(r"^gfk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
# The generated route server's health route (gpufleet_endpoint): a user's route never is.
ROUTES_HEALTH_PATH = f"{RESERVED_PREFIX}/health"


def key_digest(secret: str) -> str:
    """What the scheduler keeps of a key, and what a node sends to have it checked; what a
    node keeps of a notebook's token (the SHA-256 of the secret, hex)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_key(presented: str) -> tuple[str, str] | None:
    """(key_id, secret) of a well-formed key, else None."""
    m = KEY_RE.match(presented)
    return (m.group(1), m.group(2)) if m else None


class ServingKind(StrEnum):
    routes = "routes"  # gpufleet's route server (gpufleet_endpoint) serves the job's routes
    server = "server"  # the job's own command listens on port 80
    # A notebook (R-JOB-1): JupyterLab in /opt/ml on the worker's socket, or the job's own
    # command on port 80; opened with the job's token, not an endpoint key.
    notebook = "notebook"


# A notebook's token: made by the scheduler at submission (random, NOTEBOOK_TOKEN_BYTES) and
# kept as the job's env value NOTEBOOK_TOKEN_ENV, so it is sealed at rest and to the node like
# every env value; JupyterLab reads it from there. Only the job's creator gets it back
# (OpenNotebook). The node's proxy keeps only its SHA-256.
NOTEBOOK_TOKEN_ENV = "JUPYTER_TOKEN"
NOTEBOOK_TOKEN_BYTES = 32
NOTEBOOK_HEALTH_PATH = "/api"  # Jupyter Server's version: answered without a token
NOTEBOOK_COOKIE = "gpufleet-notebook"  # set by the proxy once a request showed the token
NOTEBOOK_COMMAND = ("jupyter", "lab")  # what a notebook runs when it gives no command


class Serving(BaseModel):
    """How a worker of an endpoint serves, as StartWorker carries it to the node."""

    kind: ServingKind
    routes: list[Route] = Field(default_factory=list, max_length=limits.ROUTES)
    # What the proxy probes (GET, any answer below 500 is ready) before requests go through.
    health_path: str = Field(default="/", pattern=r"^/[A-Za-z0-9_\-./]*$", max_length=256)


# --- an account's keys (rpc.scheduler.<verb>.<account>) --------------------------------------


class EndpointKeyCreated(BaseModel):
    """The new key: `key` is shown this once and kept nowhere."""

    view: EndpointKeyView
    key: str


class CreateEndpointKey(Command):
    """A new key for one of the acting account's endpoint jobs; its secret is in the answer
    only."""

    TYPE = "gpufleet.scheduler.create_endpoint_key.v1"
    SUBJECT = subjects.rpc("scheduler", "create_endpoint_key")
    REPLY = EndpointKeyCreated
    job_id: str = Field(min_length=1, max_length=64)
    name: str | None = Field(default=None, min_length=1, max_length=KEY_NAME_CHARS)


class EndpointKeyList(BaseModel):
    keys: list[EndpointKeyView]


class ListEndpointKeys(Command):
    """The keys of one of the acting account's endpoint jobs (never their secrets)."""

    TYPE = "gpufleet.scheduler.list_endpoint_keys.v1"
    SUBJECT = subjects.rpc("scheduler", "list_endpoint_keys")
    REPLY = EndpointKeyList
    READ = True
    job_id: str = Field(min_length=1, max_length=64)


class EndpointKeyView(BaseModel):
    key_id: str
    job_id: str
    name: str | None = None
    created_at: datetime
    revoked_at: datetime | None = None


class RevokeEndpointKey(Command):
    """Revoke a key of one of the acting account's endpoints (idempotent)."""

    TYPE = "gpufleet.scheduler.revoke_endpoint_key.v1"
    SUBJECT = subjects.rpc("scheduler", "revoke_endpoint_key")
    REPLY = EndpointKeyView
    job_id: str = Field(min_length=1, max_length=64)
    key_id: str = Field(pattern=r"^[0-9a-f]{12}$")


# --- a notebook's way in (rpc.scheduler.open_notebook.<account>) -----------------------------


class NotebookAccess(BaseModel):
    """`url` opens JupyterLab with `token` (`<url>lab?token=<token>`); `ready`: it answers."""

    job_id: str
    url: str
    token: str = Field(repr=False)
    ready: bool = False


class OpenNotebook(Command):
    """The URL and token of one of the acting account's notebooks (its creator's only)."""

    TYPE = "gpufleet.scheduler.open_notebook.v1"
    SUBJECT = subjects.rpc("scheduler", "open_notebook")
    REPLY = NotebookAccess
    READ = True
    job_id: str = Field(min_length=1, max_length=64)


# --- a node's proxy (nrpc.scheduler.verify_endpoint_key.<minion_id>) -------------------------


class EndpointKeyVerdict(BaseModel):
    """`open`: a live key of this endpoint; `elsewhere`: a live key of another endpoint (the
    proxy answers 404, as for a job it does not serve); `unknown`: no such key, a wrong
    secret, or revoked (401). `cache_s`: how long the node may reuse the verdict."""

    verdict: Literal["open", "elsewhere", "unknown"]
    cache_s: Int = Field(default=5, ge=0, le=60)


class VerifyEndpointKey(Command):
    """Does the key `key_id` (its secret's digest) open endpoint `job_id`, which the asking
    node serves now?"""

    TYPE = "gpufleet.scheduler.verify_endpoint_key.v1"
    SUBJECT = subjects.node_request("scheduler", "verify_endpoint_key")
    REPLY = EndpointKeyVerdict
    job_id: str = Field(min_length=1, max_length=64)
    key_id: str = Field(pattern=r"^[0-9a-f]{12}$")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")


# --- what a node says of the endpoints it serves (evt.worker.<verb>.<minion_id>) -------------


class ColdStartPhase(StrEnum):
    """A cold start's phases, in order: when the worker was placed (the scheduler's record),
    its image ready, its data staged, its process started, its first answer through the proxy
    (the health probe's, or a request's: whichever came first)."""

    placed = "placed"
    image_ready = "image_ready"
    data_staged = "data_staged"
    process_started = "process_started"
    first_answer = "first_answer"


class PhaseAt(BaseModel):
    phase: ColdStartPhase
    at: datetime


class EndpointReady(Event):
    """A worker of an endpoint answers through its node's proxy: its URL and when each phase
    of its cold start ended, as the node saw them (placed is the scheduler's own)."""

    TYPE = "gpufleet.worker.endpoint_ready.v1"
    SUBJECT = subjects.event("worker", "endpoint_ready") + ".{minion_id}"  # only that node
    job_id: str
    worker: Int
    placement_id: str
    minion_id: Name
    url: str = Field(max_length=512)
    phases: list[PhaseAt] = Field(default_factory=list, max_length=len(ColdStartPhase))


class EndpointMetered(Event):
    """The requests a node's proxy let through to a worker of an endpoint, and their bytes,
    since the worker started (totals, so a lost or repeated event changes nothing); at most
    once every few seconds while it serves, and once when it ends."""

    TYPE = "gpufleet.worker.endpoint_metered.v1"
    SUBJECT = subjects.event("worker", "endpoint_metered") + ".{minion_id}"  # only that node
    job_id: str
    worker: Int
    placement_id: str
    minion_id: Name
    at: datetime
    requests: Int = Field(ge=0)
    errors: Int = Field(ge=0)  # answered 5xx (by the worker, or 503 by the proxy)
    bytes_in: Int = Field(ge=0)
    bytes_out: Int = Field(ge=0)
