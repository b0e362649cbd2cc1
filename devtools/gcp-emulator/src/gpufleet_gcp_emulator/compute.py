"""Compute Engine REST (the subset gpufleet calls) and the emulator's admin endpoints.

GET    /compute/v1/projects/{p}/regions/{r}                      regions.get (quotas)
POST   /compute/v1/projects/{p}/zones/{z}/instances              instances.insert
GET    /compute/v1/projects/{p}/zones/{z}/instances[/{name}]     instances.list / get
DELETE /compute/v1/projects/{p}/zones/{z}/instances/{name}       instances.delete
POST   /compute/v1/projects/{p}/zones/{z}/instances/{name}/stop  instances.stop
GET    /compute/v1/projects/{p}/zones/{z}/operations/{op}        zoneOperations.get
POST   /compute/v1/projects/{p}/zones/{z}/operations/{op}/wait   zoneOperations.wait

GET  /admin/state                          everything, as JSON
POST /admin/faults    {"quota_exhausted": true, "insert_failures": 1, ...}
POST /admin/quota     {"project": p, "region": r, "metric": m, "limit": n}
POST /admin/preempt   {"project": p, "zone": z, "instance": name}
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from .state import ApiError, Cloud

PREFIX = "/compute/v1/projects/"


def _error_body(err: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "code": err.status,
            "message": err.message,
            "errors": [{"message": err.message, "domain": "global", "reason": err.reason}],
        }
    }


def make_handler(cloud: Cloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            return json.loads(raw) if raw.strip() else {}

        def _dispatch(self, method: str) -> None:
            path = urlsplit(self.path).path
            try:
                if path.startswith("/admin/"):
                    self._send(200, self._admin(method, path[len("/admin/") :]))
                elif path.startswith(PREFIX):
                    self._send(200, self._compute(method, path[len(PREFIX) :]))
                else:
                    raise ApiError(404, "notFound", f"no such endpoint: {path}")
            except ApiError as err:
                self._send(err.status, _error_body(err))
            except (ValueError, KeyError) as exc:
                self._send(400, _error_body(ApiError(400, "invalid", str(exc))))

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

        def _compute(self, method: str, rest: str) -> Any:
            parts = rest.split("/")
            project = parts[0]
            if method == "GET" and len(parts) == 3 and parts[1] == "regions":
                return cloud.region_resource(project, parts[2])
            if len(parts) < 4 or parts[1] != "zones":
                raise ApiError(404, "notFound", f"no such resource: {rest}")
            zone, coll, tail = parts[2], parts[3], parts[4:]
            if coll == "instances":
                if method == "POST" and not tail:
                    return cloud.insert(project, zone, self._body())
                if method == "GET" and not tail:
                    items = [r.resource() for r in cloud.list_instances(project, zone)]
                    return {"kind": "compute#instanceList", "items": items}
                if method == "GET" and len(tail) == 1:
                    return cloud.get(project, zone, tail[0]).resource()
                if method == "DELETE" and len(tail) == 1:
                    return cloud.delete(project, zone, tail[0])
                if method == "POST" and len(tail) == 2 and tail[1] == "stop":
                    return cloud.stop(project, zone, tail[0])
            if coll == "operations" and tail:
                op = cloud.operations.get(tail[0])
                if op is None:
                    raise ApiError(404, "notFound", f"operation {tail[0]} not found")
                if method == "POST" and len(tail) == 2 and tail[1] == "wait":
                    deadline = time.monotonic() + 120
                    while op["status"] != "DONE" and time.monotonic() < deadline:
                        time.sleep(0.05)
                return dict(op)
            raise ApiError(404, "notFound", f"no such resource: {rest}")

        def _admin(self, method: str, what: str) -> Any:
            if method == "GET" and what == "state":
                return cloud.snapshot()
            body = self._body()
            if what == "faults":
                for key, value in body.items():
                    if not hasattr(cloud.faults, key):
                        raise ApiError(400, "invalid", f"unknown fault {key!r}")
                    setattr(cloud.faults, key, type(getattr(cloud.faults, key))(value))
                return cloud.faults.__dict__
            if what == "quota":
                cloud.set_quota(body["project"], body["region"], body["metric"], body["limit"])
                return cloud.region_resource(body["project"], body["region"])
            if what == "preempt":
                cloud.preempt(body["project"], body["zone"], body["instance"])
                return {"preempted": body["instance"]}
            raise ApiError(404, "notFound", f"no admin endpoint {what!r}")

    return Handler


def serve_compute(cloud: Cloud, host: str, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), make_handler(cloud))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="compute-http").start()
    return server


__all__ = ["serve_compute"]
