"""`gpufleet job ...`: submit, show, list, logs, connect, cancel."""

from __future__ import annotations

import contextlib
import secrets
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from gpufleet_contracts.billing import JobCostQuery
from gpufleet_contracts.jobs import (
    CancelJob,
    GetJob,
    JobState,
    JobType,
    ListAllJobs,
    ListJobs,
    WorkerState,
)
from gpufleet_contracts.serving import OpenNotebook

from . import client, endpoints, logs, render, spec, views
from .client import CliError, StreamRecord
from .common import JsonFlag

app = typer.Typer(help="Submit, inspect, follow and cancel jobs.", no_args_is_help=True)

BILLING_JOB_COST = JobCostQuery.SUBJECT

JobId = Annotated[
    str, typer.Argument(metavar="ID", help="The job id (as printed by `job submit`).")
]


ADJECTIVES = (
    "amber", "bold", "brave", "brisk", "calm", "clever", "cosmic", "crisp", "eager", "fancy",
    "gentle", "golden", "happy", "jolly", "keen", "lively", "lucky", "mellow", "nimble", "proud",
    "quick", "quiet", "rapid", "shiny", "silent", "steady", "sunny", "swift", "tidy", "witty",
)  # fmt: skip
ANIMALS = (
    "badger", "beaver", "bison", "cobra", "condor", "crane", "dingo", "eagle", "falcon", "ferret",
    "gecko", "heron", "ibis", "jaguar", "koala", "lemur", "lynx", "marten", "moose", "ocelot",
    "otter", "panda", "puffin", "quokka", "raven", "salmon", "tapir", "walrus", "wombat", "yak",
)  # fmt: skip


def generated_name() -> str:
    """A job name when none is given, made up as dstack does: 'brisk-otter-3f2a' (900 word
    pairs, 65,536 suffixes; within JobSpec's name rules)."""
    return f"{secrets.choice(ADJECTIVES)}-{secrets.choice(ANIMALS)}-{secrets.token_hex(2)}"


def _terminal(value: Any) -> bool:
    try:
        return JobState(str(value)).terminal
    except ValueError:
        return False


def get_job(job_id: str) -> dict[str, Any]:
    """The scheduler's job object, a JobView (not_found for another account's job too)."""
    return client.checked(GetJob(job_id=job_id))


def job_cost(job_id: str) -> dict[str, Any]:
    """`cost` and `cost_micro` from billing; null with a `cost_note` when it does not answer
    (asked once: a billing that is down must not hold the job's page)."""
    try:
        reply = client.checked(JobCostQuery(job_id=job_id), retry=False)
    except CliError as exc:
        return {"cost": None, "cost_micro": None, "cost_note": f"billing: {exc.message}"}
    return {"cost": reply.get("cost"), "cost_micro": reply.get("cost_micro")}


def read_logs(job_id: str) -> list[StreamRecord]:
    """Every log chunk of the job; none when the stream cannot be read."""
    try:
        return client.read_logs(job_id)
    except CliError as exc:
        if exc.code == "invalid":
            raise
        return []


@app.command(
    context_settings={"allow_interspersed_args": False},
    epilog="Example: gpufleet job submit --name train-1 --gpu-type 'RTX 3090' --gpu-count 2 "
    "-- python train.py --epochs 3",
)
def submit(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- COMMAND",
            help="What each worker runs; put it after `--`.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            metavar="NAME",
            help="Job name (default: the file's, else a generated one like brisk-otter-3f2a, "
            "printed on stderr).",
        ),
    ] = None,
    gpu_type: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu-type",
            "-g",
            metavar="MODEL",
            help="Acceptable GPU model, e.g. 'RTX 3090' (repeatable).",
        ),
    ] = None,
    gpu_count: Annotated[
        str | None,
        typer.Option(
            "--gpu-count", metavar="N", help="GPUs per worker (0..16; 0: a CPU-only job)."
        ),
    ] = None,
    cpu_count: Annotated[
        str | None,
        typer.Option(
            "--cpu-count",
            metavar="N",
            help="CPUs per worker of a CPU-only job (--gpu-count 0, no --gpu-type; 4..256, "
            "a multiple of 4).",
        ),
    ] = None,
    max_price: Annotated[
        str | None,
        typer.Option(
            "--max-price",
            metavar="CREDITS",
            help="Highest rate per GPU-hour (per CPU-hour for a CPU-only job).",
        ),
    ] = None,
    disk_size: Annotated[
        str | None,
        typer.Option("--disk-size", metavar="GB", help="Disk per worker (10..1000 GB)."),
    ] = None,
    workers: Annotated[
        str | None, typer.Option("--workers", metavar="N", help="Number of workers (1..64).")
    ] = None,
    job_type: Annotated[
        str | None,
        typer.Option("--type", metavar="TYPE", help="training|notebook|inference|endpoint."),
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            metavar="NAME",
            help="A project of yours, or OWNER/NAME of a project you are a member of.",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", metavar="KEY=VALUE", help="Environment (repeatable)."),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option("--region", metavar="REGION", help="Pin the job to a region (R-RES-1)."),
    ] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option("--dataset", metavar="NAME", help="Attach a dataset (repeatable)."),
    ] = None,
    checkpoint: Annotated[
        list[str] | None,
        typer.Option("--checkpoint", metavar="NAME", help="Attach a checkpoint (repeatable)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", metavar="SOURCE:PATH", help="Model code, e.g. git:https://..."),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", metavar="TYPE:PATH", help="Upload output, e.g. aws:s3://b/x."),
    ] = None,
    allow_burst: Annotated[
        bool | None,
        typer.Option("--allow-burst", help="May burst to the cloud (R-SCHED-3)."),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", metavar="IMAGE", help="Run in this image (registry/name:tag)."),
    ] = None,
    key: Annotated[
        list[str] | None,
        typer.Option("--key", metavar="KEY", help="Attach a third-party key (repeatable)."),
    ] = None,
    pip: Annotated[
        list[str] | None,
        typer.Option("--pip", metavar="PACKAGE", help="Install a pip package (repeatable)."),
    ] = None,
    server_command: Annotated[
        str | None,
        typer.Option(
            "--server-command",
            metavar="COMMAND",
            help="An endpoint's own server, listening on port 80 in the foreground, e.g. "
            "'python3 -m http.server 80' (split as a shell would). Routes come from --file.",
        ),
    ] = None,
    health_path: Annotated[
        str | None,
        typer.Option(
            "--health-path",
            metavar="PATH",
            help="What the node probes (GET) before an endpoint's own server gets requests; "
            "any answer below 500 is ready (default: /).",
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            metavar="FILE",
            help="Spec as YAML or JSON; flags override its fields.",
        ),
    ] = None,
    request_id: Annotated[
        str | None,
        typer.Option(
            "--request-id",
            metavar="ID",
            help="Makes the submission idempotent: the same ID again gets the job it queued "
            "(default: a new random one, so an unanswered ask can be repeated safely).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Submit a job. The spec is validated here first; nothing is sent if it is not valid."""
    with render.reported(as_json, spec.FLAGS):
        base = spec.load_file(file) if file is not None else {}
        generated = None if name or base.get("name") else generated_name()
        flags = {
            "name": name or generated,
            "gpu_types": gpu_type,
            "gpu_count": spec.integer(gpu_count),
            "cpu_count": spec.integer(cpu_count),
            "max_price": max_price,
            "disk_size_gb": spec.integer(disk_size),
            "workers": spec.integer(workers),
            "type": job_type,
            "project": project,
            "command": command,
            "region": region,
            "datasets": spec.named(dataset),
            "checkpoints": spec.named(checkpoint),
            "model": spec.location(model, "source"),
            "output_data": spec.location(output, "type"),
            "allow_burst": allow_burst,
            "environment": spec.environment(base.get("environment"), image, key, pip),
            "endpoint": spec.endpoint(base.get("endpoint"), server_command, health_path),
        }
        job_spec = spec.build(base, flags, env or [])
        reply = client.checked(spec.submission(job_spec, request_id or uuid.uuid4().hex))
    if as_json:
        render.emit_json(reply)
        return
    sys.stdout.write(f"{reply.get('id')}\n")
    note = render.state(reply.get("state"), render.cpu_only(reply) or job_spec.gpu_count == 0)
    if reply.get("state") == "queued":
        note += f": {render.text(reply.get('queue_reason'))}"
    # A name made up here is said once, with the id (the reply's: a repeated --request-id
    # answers with the job it queued first).
    named = f" as {render.text(reply.get('name') or generated)}" if generated else ""
    render.err().print(f"submitted{named}; {note}")


@app.command()
def show(job_id: JobId, as_json: JsonFlag = False) -> None:
    """A job: state, history, node(s), locked rate, run time, cost and its log tail."""
    with render.reported(as_json):
        logs.subject_for(job_id)
        job = get_job(job_id)
    merged: dict[str, Any] = {**job, **job_cost(job_id)}
    workers = logs.group(read_logs(job_id)) or logs.from_job(job)
    merged["log_tail"] = logs.join(workers, logs.several(job, workers), tail=logs.TAIL_LINES)
    if as_json:
        render.emit_json(merged)
    else:
        views.job_detail(merged)


@app.command("list")
def list_(
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, max=1000, help="At most N jobs.")
    ] = 100,
    all_accounts: Annotated[
        bool,
        typer.Option("--all-accounts", help="Operators: every account's jobs, with their owner."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Your jobs, newest first (operators: every account's, with --all-accounts)."""
    with render.reported(as_json):
        msg = ListAllJobs(limit=limit) if all_accounts else ListJobs(limit=limit)
        try:
            reply = client.checked(msg)
        except CliError as exc:
            if all_accounts and exc.code == "forbidden":
                raise CliError(
                    "--all-accounts is for operators: this credential is a user's", exc.code
                ) from exc
            raise
    if as_json:
        render.emit_json(reply)
    else:
        jobs = [j for j in reply.get("jobs") or [] if isinstance(j, dict)]
        views.job_table(jobs, owners=all_accounts)


def _follow(job_id: str, on_msg: Callable[[StreamRecord], None]) -> None:
    poll = GetJob(job_id=job_id)
    client.follow_logs(
        job_id,
        on_msg,
        poll=(poll.SUBJECT, poll.to_bytes(), poll.TYPE),
        done=lambda reply: _terminal(reply.get("state")),
    )


@app.command("logs")
def logs_(
    job_id: JobId,
    follow: Annotated[
        bool, typer.Option("--follow", "-F", help="Keep printing until the job ends (or Ctrl-C).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """A job's output, per worker (lines prefixed with the worker when it has several)."""
    with render.reported(as_json):
        logs.subject_for(job_id)
        job = get_job(job_id)
        following = follow and not _terminal(job.get("state"))
        if following and not as_json:
            printer = logs.LinePrinter(prefix=logs.several(job, {}))
            try:
                _follow(job_id, printer)
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            finally:
                printer.close()
            return
        if following:
            records: list[StreamRecord] = []
            with contextlib.suppress(KeyboardInterrupt):  # print what was read so far
                _follow(job_id, records.append)
        else:
            records = read_logs(job_id)
    workers = logs.group(records) or logs.from_job(job)
    if as_json:
        render.emit_json({"job_id": job_id, "workers": workers})
    else:
        sys.stdout.write(logs.join(workers, logs.several(job, workers)))


@app.command()
def connect(
    job_id: JobId,
    into: Annotated[
        Path,
        typer.Option(
            "--into", metavar="DIR", help="Where its local output is received (default: here)."
        ),
    ] = Path("."),
) -> None:
    """Send a job's local data from this machine, and receive its local output. The job
    waits for it in `starting` ("waiting for you to connect"); its output, once put, is kept
    for a week: run this again to receive it."""
    from . import connect as connecting  # httpx and rich's progress: for this command only

    with render.reported(False):
        try:
            connecting.connect(job_id, into)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


@app.command("open")
def open_(job_id: JobId, as_json: JsonFlag = False) -> None:
    """Print an endpoint's URL and a request that reaches it, or a notebook's URL with its
    token (exit 1 while it has none)."""
    with render.reported(as_json):
        job = get_job(job_id)
        if endpoints.job_type(job) == JobType.notebook:
            access = client.checked(OpenNotebook(job_id=job_id))
            _opened_notebook(access, as_json)
            return
        url = job.get("url")
        if not url:
            raise CliError(endpoints.no_url(job), "no_url")
    curl = endpoints.example(job, str(url))
    if as_json:
        render.emit_json({"id": job.get("id"), "url": url, "example": curl})
        return
    sys.stdout.write(f"{url}\n")
    render.err().print(
        f"call it with a key (gpufleet endpoint key create {render.text(job_id)}):\n"
        f"  {render.text(curl)}"
    )


def _opened_notebook(access: dict[str, Any], as_json: bool) -> None:
    """A notebook's URL with its token, alone on stdout (for a browser or `$(...)`); on
    stderr, that the token is a secret."""
    if as_json:
        render.emit_json(access)
        return
    url = str(access.get("url") or "").rstrip("/")
    sys.stdout.write(f"{url}/lab?token={access.get('token')}\n")
    sys.stdout.flush()
    waiting = "" if access.get("ready") else " (JupyterLab is still starting: it answers soon)"
    render.err().print(
        f"open it in a browser{waiting}. [bold]The token in this URL opens notebook "
        f"{render.text(access.get('job_id'))} as you: keep it secret[/] (only you can get it)"
    )


@app.command()
def cancel(job_id: JobId, as_json: JsonFlag = False) -> None:
    """Cancel a job: waiting workers are dropped, running ones stopped."""
    with render.reported(as_json):
        reply = client.checked(CancelJob(job_id=job_id))
    if as_json:
        render.emit_json(reply)
    else:
        render.out().print(f"job {render.text(reply.get('id', job_id))}: {cancelled(reply)}")


def cancelled(job: dict[str, Any]) -> str:
    """What a cancel did, read from the job it answers with: `stopping` while the workers
    that held GPUs or CPUs are told to stop, `stopped` when there were only waiting workers
    to drop, or that the job had already ended (a cancel makes no job finished or failed)."""
    value = job.get("state")
    if not _terminal(value):
        told = [
            w
            for w in job.get("workers") or []
            if isinstance(w, dict)
            and w.get("state") in (WorkerState.placed, WorkerState.running, WorkerState.uploading)
        ]
        return "[cyan]stopping[/]" + (f" ({len(told)} worker(s) told to stop)" if told else "")
    if value == JobState.stopped:
        return render.state(value)
    return f"already {render.state(value)}; nothing to cancel"
