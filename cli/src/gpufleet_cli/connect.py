"""`gpufleet job connect ID`: send a job's `local` input, model code or checkpoint from this
machine and receive its `local` output (R-JOB-3, R-JOB-4), through the platform's object
store (gpufleet_contracts.localdata): this machine and the node never connect to each other.

The scheduler answers only the job's own account. Each `local` mount not yet sent is packed
(packing.py) and PUT at the presigned URL the scheduler grants for it, then said sent (the
datastore reads its size back); the job's workers, waiting in `starting` ("waiting for you
to connect"), then get it. With a `local` output it waits for the workers' zips and
downloads each into `--into` (checked against the SHA-256 the datastore recorded); run again
later, it downloads them while the relay keeps them (RELAY_DAYS). A URL is a credential:
never printed.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from gpufleet_contracts.localdata import (
    RELAY_DAYS,
    ConnectJob,
    LocalConnection,
    LocalDataSent,
    LocalFile,
    LocalMountView,
    RelayGrant,
)
from gpufleet_contracts.states import JobState
from pydantic import ValidationError
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)

from . import client, render
from .client import CliError
from .packing import PackRefused, packed

CHUNK = 1 << 20
TIMEOUT_S = 60.0
POLL_S = 3.0


def ask(body: ConnectJob) -> LocalConnection:
    reply = client.request(body.SUBJECT, body.to_bytes(), ce_type=body.TYPE, retry=True)
    try:
        return LocalConnection.model_validate(reply)
    except ValidationError:
        raise CliError("the scheduler's answer is unreadable", "internal") from None


def _bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=render.err(),
        transient=False,
    )


def _checked(what: str, response: httpx.Response) -> None:
    if response.status_code >= 300:
        raise CliError(f"{what}: the store answered HTTP {response.status_code}")


def _http() -> httpx.Client:
    return httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)


def put(grant: RelayGrant, path: Path, size: int, what: str) -> None:
    """PUT the file at `path` at its grant's URL, showing how far."""
    with _bar() as bar:
        task = bar.add_task(what, total=size)

        def chunks() -> Iterator[bytes]:
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    bar.advance(task, len(chunk))
                    yield chunk

        try:
            with _http() as http:
                response = http.put(
                    grant.url, content=chunks(), headers={"Content-Length": str(size)}
                )
        except httpx.HTTPError as exc:
            raise CliError(f"{what}: cannot reach the store ({type(exc).__name__})") from None
    _checked(what, response)


def get(grant: RelayGrant, into: Path) -> Path:
    """GET a relayed output into `into` under its name, its SHA-256 checked."""
    target = into / grant.name
    part = into / f".{grant.name}.part"
    sha = hashlib.sha256()
    try:
        with _bar() as bar, _http() as http, http.stream("GET", grant.url) as response:
            _checked(grant.name, response)
            task = bar.add_task(f"receiving {grant.name}", total=grant.size)
            with part.open("wb") as f:
                for chunk in response.iter_bytes(CHUNK):
                    sha.update(chunk)
                    f.write(chunk)
                    bar.advance(task, len(chunk))
    except httpx.HTTPError as exc:
        part.unlink(missing_ok=True)
        raise CliError(f"{grant.name}: cannot reach the store ({type(exc).__name__})") from None
    if grant.sha256 is not None and sha.hexdigest() != grant.sha256:
        part.unlink(missing_ok=True)
        raise CliError(f"{grant.name}: its checksum differs from the one recorded", "internal")
    part.replace(target)
    return target


def send(job_id: str, mounts: list[LocalMountView]) -> None:
    """Pack and put every `local` input not sent yet, and say each is sent."""
    todo = [m for m in mounts if m.direction == "input" and m.state != "ready"]
    if not todo:
        return
    with tempfile.TemporaryDirectory(prefix="gpufleet-connect-") as tmp:
        for i, m in enumerate(todo):
            work = Path(tmp) / str(i)
            work.mkdir()
            try:
                sending = packed(m.path, work)
            except (PackRefused, OSError) as exc:
                raise CliError(f"{m.mount}: {exc}", "invalid") from None
            asked = ask(
                ConnectJob(job_id=job_id, sending=[LocalFile(mount=m.mount, name=sending.name)])
            )
            (grant,) = [g for g in asked.uploads if g.mount == m.mount]
            put(grant, sending.path, sending.size, f"sending {m.path} ({sending.name})")
            said = LocalDataSent(job_id=job_id, mount=m.mount)
            reply = client.request(said.SUBJECT, said.to_bytes(), ce_type=said.TYPE)
            if reply.get("size") != sending.size:
                raise CliError(f"{m.mount}: the store holds {reply.get('size')} bytes", "internal")
            render.out().print(f"sent {render.text(m.path)} for {render.text(m.mount)}")


def receive(job_id: str, into: Path, conn: LocalConnection) -> list[Path]:
    """Wait for the job's `local` outputs and download each once; until they all came, or the
    job ended without the rest."""
    got: dict[str, Path] = {}
    while True:
        for grant in conn.downloads:
            if grant.name not in got:
                got[grant.name] = get(grant, into)
                render.out().print(f"received {render.text(str(got[grant.name]))}")
        if len(got) >= conn.outputs_expected:
            return list(got.values())
        if _ended(conn.state):  # its outputs were put before it ended: all there are
            missing = conn.outputs_expected - len(got)
            raise CliError(f"job {job_id} ended {conn.state} without {missing} of its outputs")
        time.sleep(POLL_S)
        conn = ask(ConnectJob(job_id=job_id))


def _ended(state: Any) -> bool:
    try:
        return JobState(str(state)).terminal
    except ValueError:
        return False


def connect(job_id: str, into: Path) -> None:
    conn = ask(ConnectJob(job_id=job_id))
    if not _ended(conn.state):  # an ended job takes nothing more
        send(job_id, conn.mounts)
    if not conn.outputs_expected:
        return
    into.mkdir(parents=True, exist_ok=True)
    if not _ended(conn.state):
        render.err().print(
            f"waiting for job {render.text(job_id)}'s output (Ctrl-C to stop; "
            f"run again within {RELAY_DAYS} days to receive it)"
        )
    receive(job_id, into, ask(ConnectJob(job_id=job_id)))
