"""Readable (rich) forms of the services' replies; --json never comes through here."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape
from rich.panel import Panel
from rich.table import Column, Table
from rich.text import Text

from .render import duration, out, state, text, when


def _col(header: str) -> Column:
    """A column that is never wrapped (times, ids, amounts)."""
    return Column(header, no_wrap=True)


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def worker_seconds(w: dict[str, Any]) -> float | None:
    """A worker's run time; a running worker counts up to now."""
    secs = w.get("run_seconds")
    if isinstance(secs, int | float):
        return float(secs)
    if not w.get("started_at") or w.get("ended_at"):
        return None
    try:
        started = datetime.fromisoformat(str(w["started_at"]))
    except ValueError:
        return None
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    return (datetime.now(UTC) - started).total_seconds()


def run_seconds(job: dict[str, Any]) -> float | None:
    """The longest worker run."""
    runs = [s for w in _dicts(job.get("workers")) if (s := worker_seconds(w)) is not None]
    return max(runs) if runs else None


def _nodes(job: dict[str, Any]) -> str:
    parts = []
    for w in _dicts(job.get("workers")):
        if w.get("node") and w.get("cpu_count"):  # a CPU-only worker (R-JOB-2)
            parts.append(f"{w['node']} ({w['cpu_count']} CPUs)")
        elif w.get("node"):
            gpus = ",".join(str(i) for i in w.get("gpu_indices") or [])
            parts.append(f"{w['node']} ({w.get('gpu_model') or '?'} [{gpus}])")
    return ", ".join(dict.fromkeys(parts)) or "-"


def job_detail(job: dict[str, Any]) -> None:
    """Header, state history and log tail of `job show`."""
    cost = job.get("cost")
    cost_text = f"{cost} credits" if cost is not None else f"- ({job.get('cost_note', '')})"
    rate = job.get("rate")
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("job", f"{text(job.get('id'))}  {text(job.get('name'))}")
    if job.get("state") == "queued":
        head.add_row("state", state("queued") + f": {text(job.get('queue_reason'))}")
    else:
        head.add_row("state", state(job.get("state")))
    waiting = [w for w in _dicts(job.get("workers")) if w.get("state") == "waiting"]
    if waiting and job.get("state") != "queued":
        # Some workers run, others still wait for GPUs (R-JOB-5): say why they wait.
        head.add_row(
            "waiting",
            f"{len(waiting)} worker(s): {text(job.get('queue_reason') or 'not yet considered')}",
        )
    head.add_row("node(s)", escape(_nodes(job)))
    cpu_only = any(w.get("cpu_count") for w in _dicts(job.get("workers")))
    unit = "CPU-hour" if cpu_only else "GPU-hour"
    head.add_row("rate", f"{text(rate)} credits/{unit}" if rate else "-")
    head.add_row("run time", duration(run_seconds(job)))
    head.add_row("cost", escape(cost_text))
    console = out()
    console.print(head)

    history = Table("State", _col("Time"), "Reason", title="history", title_justify="left")
    for h in _dicts(job.get("history")):
        history.add_row(state(h.get("state")), when(h.get("at")), text(h.get("reason")))
    console.print(history)

    detail = _dicts(job.get("queue_detail"))
    if detail and waiting:
        why = Table(_col("Nodes"), "Ruled out because", title="why waiting", title_justify="left")
        for d in detail:
            why.add_row(text(d.get("nodes")), text(d.get("reason")))
        console.print(why)
    notes = _dicts(job.get("notes"))
    if notes:
        nt = Table(_col("Time"), "Note", title="notes", title_justify="left")
        for n in notes:
            nt.add_row(when(n.get("at")), text(n.get("note")))
        console.print(nt)

    workers = _dicts(job.get("workers"))
    if len(workers) > 1 or any(w.get("exit_code") is not None for w in workers):
        table = Table(
            "Worker",
            "State",
            "Node",
            "GPUs",
            "Run time",
            "Exit",
            "Reason",
            title="workers",
            title_justify="left",
        )
        for w in workers:
            table.add_row(
                text(w.get("index")),
                state(w.get("state")),
                text(w.get("node")),
                text(w.get("gpu_indices")),
                duration(worker_seconds(w)),
                text(w.get("exit_code")),
                text(w.get("reason")),
            )
        console.print(table)

    tail = str(job.get("log_tail") or "")
    console.print(
        Panel(Text(tail.rstrip("\n") or "(no output yet)"), title="log tail", title_align="left")
    )


def job_table(jobs: list[dict[str, Any]]) -> None:
    table = Table(_col("ID"), "Name", _col("State"), "Workers", "GPUs", "Rate", _col("Queued at"))
    for j in jobs:
        spec = j.get("spec")
        if not isinstance(spec, dict):
            spec = {}
        count = spec.get("gpu_fraction") or spec.get("gpu_count", "?")
        gpus = f"{count} x {'/'.join(spec.get('gpu_types') or [])}"
        table.add_row(
            text(j.get("id")),
            text(j.get("name")),
            state(j.get("state")),
            text(spec.get("workers")),
            escape(gpus),
            text(j.get("rate")),
            when(j.get("queued_at")),
        )
    out().print(table if jobs else "no jobs")


def gpu_summary(gpus: Any) -> str:
    """'2 x RTX 3090' (models counted, NVML name when not in the catalogue)."""
    counts = Counter(str(g.get("model") or g.get("nvml_name") or "?") for g in _dicts(gpus))
    return ", ".join(f"{n} x {m}" for m, n in counts.items()) or "none"


def node_table(nodes: list[dict[str, Any]]) -> None:
    table = Table("Name", "Region", "State", "GPUs", "Simulated", _col("Last seen"))
    for n in nodes:
        table.add_row(
            text(n.get("name")),
            text(n.get("region")),
            state(n.get("state")),
            escape(gpu_summary(n.get("gpus"))),
            "yes" if n.get("simulated") else "no",
            when(n.get("last_seen")),
        )
    out().print(table if nodes else "no nodes")


def entry_table(entries: list[dict[str, Any]]) -> None:
    table = Table(_col("At"), "Kind", _col("Amount"), "Job", "Worker", "Memo")
    for e in entries:
        table.add_row(
            when(e.get("at")),
            text(e.get("kind")),
            text(e.get("amount")),
            text(e.get("job_id")),
            text(e.get("worker")),
            text(e.get("memo")),
        )
    out().print(table if entries else "no ledger entries")


def health_table(rows: list[dict[str, Any]]) -> None:
    table = Table("Service", "Status", "Collections")
    for r in rows:
        detail = r.get("collections") if r.get("status") != "down" else r.get("error")
        table.add_row(text(r.get("service")), state(r.get("status")), text(detail))
    out().print(table)


def dlq_table(records: list[dict[str, Any]]) -> None:
    table = Table(
        "Seq", _col("At"), "Service", Column("Subject", overflow="fold"), "Reason", "Errors"
    )
    for r in records:
        errors = "; ".join(
            f"{e.get('field', '')}: {e.get('message', e.get('error', ''))}"
            for e in _dicts(r.get("errors"))
        )
        table.add_row(
            text(r.get("seq")),
            when(r.get("at")),
            text(r.get("service")),
            text(r.get("subject")),
            text(r.get("reason")),
            text(errors),
        )
    out().print(table if records else "the dead-letter queue is empty")
