"""One origin per job: the proxy's URL template (`http://{job}.localhost:8480`) and the job a
request's Host names, read against it. Plain data in, plain data out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

# A job id as a DNS label: what the scheduler makes (`j` + 12 hex) and nothing with a dot,
# a slash, a percent sign or anything else a Host trick needs.
JOB_LABEL = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port` (`[::1]:8480` for IPv6)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{listen!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class UrlTemplate:
    """`scheme://<prefix>{job}<suffix>`: the URL of each job this node serves."""

    template: str
    scheme: str
    prefix: str  # lowercase, before {job} in the host (usually empty)
    suffix: str  # lowercase, after it: `.localhost:8480`

    @classmethod
    def parse(cls, template: str) -> UrlTemplate:
        parts = urlsplit(template)
        if parts.scheme not in DEFAULT_PORTS:
            raise ValueError(f"{template!r}: the scheme must be http or https")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{template!r}: a template names a host and port, no path")
        netloc = parts.netloc
        if netloc.count("{job}") != 1 or "@" in netloc:
            raise ValueError(f"{template!r}: its host must hold {{job}} once, and no user")
        prefix, _, suffix = netloc.partition("{job}")
        if prefix and not prefix.endswith("."):  # the job is a whole label
            raise ValueError(f"{template!r}: {{job}} must be a whole label of the host")
        if suffix and not suffix.startswith((".", ":")):
            raise ValueError(f"{template!r}: {{job}} must be a whole label of the host")
        default = DEFAULT_PORTS[parts.scheme]
        suffix = suffix.lower().removesuffix(default)
        return cls(template.rstrip("/"), parts.scheme, prefix.lower(), suffix)

    def url(self, job_id: str) -> str:
        return self.template.replace("{job}", job_id)

    def job_of(self, host: str | None) -> str | None:
        """The job the Host header names, or None (not this proxy's form, or not a job id):
        compared in lowercase, the scheme's default port ignored, a trailing dot refused."""
        if not host:
            return None
        h = host.strip().lower().removesuffix(DEFAULT_PORTS[self.scheme])
        if not h.startswith(self.prefix) or not h.endswith(self.suffix):
            return None
        label = h[len(self.prefix) : len(h) - len(self.suffix)]
        return label if JOB_LABEL.fullmatch(label) else None
