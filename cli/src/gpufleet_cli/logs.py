"""Worker log chunks (subject gpufleet.v1.log.<minion>.<job>.<worker>, in the log stream of
the node that ran the worker), read through the scheduler's `job_logs` request."""

from __future__ import annotations

import codecs
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from gpufleet_contracts import subjects

from .client import CliError, StreamRecord

TAIL_LINES = 40
_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")


def subject_for(job_id: str) -> str:
    """Subject filter of every worker's log of a job, on whichever node ran it; refuses ids
    that are not one token."""
    if not _TOKEN.fullmatch(job_id):
        raise CliError(f"{job_id!r} is not a job id", "invalid")
    return f"{subjects.LOGS}.*.{job_id}.*"


def worker_of(subject: str) -> str:
    """The worker number: the subject's last token."""
    return subject.rsplit(".", 1)[-1]


def _order(worker: str) -> tuple[int, str]:
    return (int(worker), "") if worker.isdigit() else (1 << 30, worker)


def group(records: Iterable[StreamRecord]) -> dict[str, str]:
    """Text per worker, chunks joined in stream order, workers in number order."""
    raw: dict[str, bytes] = {}
    for r in records:  # as the scheduler gave them: node by node, each in stream order
        w = worker_of(r.subject)
        raw[w] = raw.get(w, b"") + r.data
    return {w: raw[w].decode("utf-8", "replace") for w in sorted(raw, key=_order)}


def from_job(job: dict[str, Any]) -> dict[str, str]:
    """The workers' `log_tail` fields of a job object (when the stream has nothing)."""
    out: dict[str, str] = {}
    for w in job.get("workers") or []:
        if isinstance(w, dict) and w.get("log_tail"):
            out[str(w.get("index", len(out)))] = str(w["log_tail"])
    return out


def several(job: dict[str, Any], workers: dict[str, str]) -> bool:
    """Whether lines need a `[w<N>]` tag: several workers in the logs or in the spec."""
    spec = job.get("spec")
    count = spec.get("workers", 1) if isinstance(spec, dict) else 1
    return len(workers) > 1 or (isinstance(count, int) and count > 1)


def join(workers: dict[str, str], prefix: bool, tail: int | None = None) -> str:
    """One text: each worker's lines (its last `tail` ones), prefixed `[w<N>] ` if asked."""
    parts: list[str] = []
    for w, body in workers.items():
        lines = body.splitlines()
        if tail is not None:
            lines = lines[-tail:]
        parts.extend(f"[w{w}] {line}" if prefix else line for line in lines)
    return "\n".join(parts) + ("\n" if parts else "")


class LinePrinter:
    """Writes chunks as they arrive; with `prefix`, whole lines only, each tagged `[w<N>]`."""

    def __init__(self, prefix: bool, write: Callable[[str], Any] | None = None) -> None:
        self.prefix = prefix
        self._write = write
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._partial: dict[str, str] = {}

    def write(self, text: str) -> None:
        (self._write or sys.stdout.write)(text)

    def __call__(self, record: StreamRecord) -> None:
        w = worker_of(record.subject)
        dec = self._decoders.setdefault(w, codecs.getincrementaldecoder("utf-8")("replace"))
        chunk = dec.decode(record.data)
        if not self.prefix:
            self.write(chunk)
        else:
            *lines, rest = (self._partial.get(w, "") + chunk).split("\n")
            self._partial[w] = rest
            for line in lines:
                self.write(f"[w{w}] {line}\n")
        sys.stdout.flush()

    def close(self) -> None:
        """Write what is left of unfinished lines."""
        for w, rest in self._partial.items():
            if rest:
                self.write(f"[w{w}] {rest}\n")
        self._partial.clear()
