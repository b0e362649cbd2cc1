"""Readable (rich) forms of the services' replies; --json never comes through here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import cached_property
from typing import Any, Literal

from gpufleet_contracts.nodes import GpuSample, NodeHeartbeat
from pydantic import ValidationError
from rich import box
from rich.console import JustifyMethod
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .render import cpu_only, duration, out, state, text, when


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


# --- tables that fit the terminal ---------------------------------------------------------

TIMES = "\N{MULTIPLICATION SIGN}"  # in '1xRTX 3090', one cell wide
GAP = 2  # cells between two columns (box.SIMPLE_HEAD, no edge, padding on the right only)


@dataclass(frozen=True)
class Col:
    """A column of a fitted table: its header, its cells (rich markup) and how it gives way.

    A column keeps its full width on one line (ids, states, amounts, times are never cut or
    wrapped) unless it has a `floor` and a `cut` step has been taken for it: it is then cut
    with an ellipsis down to `floor` cells (names, memos), or, with `wrap`, wraps down to
    `floor` cells (the prose of a detail view). `short` is a compact form of every cell
    (times), put in by a `short` step.
    """

    header: str
    cells: list[str]
    short: list[str] | None = None
    floor: int = 0
    wrap: bool = False
    justify: JustifyMethod = "left"
    giving: bool = False  # a `cut` step was taken for it

    @cached_property
    def natural(self) -> int:
        return max([_cell_width(escape(self.header)), *(_cell_width(c) for c in self.cells)])

    @property
    def least(self) -> int:
        """The narrowest it may be now."""
        if not (self.floor and self.giving):
            return self.natural
        return min(self.natural, max(self.floor, _cell_width(escape(self.header))))

    def after(self, how: Literal["short", "cut"]) -> Col:
        if how == "cut":
            return replace(self, giving=True)
        return replace(self, cells=self.short) if self.short else self


# What a table gives up next, by column header: `drop` it, put in its `short` form, `cut` it.
Step = tuple[Literal["drop", "short", "cut"], str]


def _cell_width(markup: str) -> int:
    return max((Text.from_markup(line).cell_len for line in markup.split("\n")), default=0)


def _need(cols: Sequence[Col]) -> int:
    return sum(c.least for c in cols) + GAP * (len(cols) - 1)


def fitted(cols: Sequence[Col], steps: Sequence[Step], width: int, **kw: Any) -> Table:
    """A table of `cols` as wide as it needs and at most `width`: while it does not fit, the
    next of `steps` (the table's own order, least important first) gives up some width.
    The columns that were cut share what is left, up to their natural widths."""
    kept = list(cols)
    for how, header in steps:
        if _need(kept) <= width:
            break
        if how == "drop":
            kept = [c for c in kept if c.header != header]
        else:
            kept = [c.after(how) if c.header == header else c for c in kept]
    widths = [c.least for c in kept]
    spare = width - _need(kept)
    growing = [i for i, c in enumerate(kept) if widths[i] < c.natural]
    while spare > 0 and growing:
        for i in list(growing):
            if spare == 0:
                break
            widths[i] += 1
            spare -= 1
            if widths[i] >= kept[i].natural:
                growing.remove(i)
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, GAP - 1, 0, 0),
        title_justify="left",
        **kw,
    )
    for c, w in zip(kept, widths, strict=True):
        table.add_column(
            escape(c.header),
            width=w,
            justify=c.justify,
            no_wrap=not c.wrap,
            overflow="fold" if c.wrap else "ellipsis",
        )
    for row in zip(*(c.cells for c in kept), strict=True):
        table.add_row(*row)
    return table


def _line(markup: str) -> str:
    """A cell that must stay on one line (a memo, a name): line breaks become spaces."""
    return " ".join(markup.split("\n"))


def gpus(spec: dict[str, Any], short: bool = False) -> str:
    """What a worker asks for: '1xRTX 3090' (count TIMES the models it may get, '/' between
    them), '0.5xRTX 3090' (a share of one GPU), '4 CPUs' (a CPU-only job). `short`: the
    first model and how many others ('2xRTX 3090/+2')."""
    if spec.get("gpu_count") == 0 or spec.get("cpu_count"):
        return f"{spec.get('cpu_count') or '?'} CPUs"
    count = _number(spec.get("gpu_fraction")) or spec.get("gpu_count", "?")
    models = [str(t) for t in spec.get("gpu_types") or []] or ["?"]
    if short and len(models) > 1:
        models = [models[0], f"+{len(models) - 1}"]
    return f"{count}{TIMES}{'/'.join(models)}"


def _number(value: Any) -> str | None:
    """A decimal as written, without trailing zeros ('0.50' -> '0.5'); None when missing."""
    if value is None or value == "":
        return None
    try:
        return f"{Decimal(str(value)).normalize():f}"
    except InvalidOperation:
        return str(value)


def rates(value: Any) -> str:
    """A locked rate, exact and without trailing zeros ('0.0125', '0.050000' -> '0.05');
    workers at different rates: 'lowest-highest'."""
    if isinstance(value, list) and value:
        try:
            ordered = sorted((str(v) for v in value), key=Decimal)
        except InvalidOperation:
            ordered = [str(v) for v in value]
        low, high = _number(ordered[0]), _number(ordered[-1])
        return escape(str(low) if low == high else f"{low}-{high}")
    return text(_number(value))


def _time_col(header: str, values: Sequence[Any]) -> Col:
    """Times in full, or short once the table narrows."""
    return Col(header, [when(v) for v in values], short=[when(v, short=True) for v in values])


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


def _worker_gpus(w: dict[str, Any]) -> str:
    """'2xRTX 3090 [0,1]' (the GPUs a worker holds, by index), '8 CPUs', '-' before it is
    placed."""
    if w.get("cpu_count"):
        return f"{w['cpu_count']} CPUs"
    indices = [str(i) for i in w.get("gpu_indices") or []]
    if not indices:
        return "-"
    count = _number(w.get("gpu_fraction")) or len(indices)
    return f"{count}{TIMES}{w.get('gpu_model') or '?'} [{','.join(indices)}]"


def _bytes(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    if n < 1000:
        return f"{n} B"
    size = n / 1000
    for unit in ("kB", "MB"):
        if size < 1000:
            return f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def endpoint_rows(job: dict[str, Any]) -> list[tuple[str, str]]:
    """An endpoint's URL, cold start (each phase's seconds after placement) and requests,
    as far as the job has them."""
    rows = []
    if job.get("url"):
        rows.append(("url", text(job.get("url"))))
    cold = job.get("cold_start")
    if isinstance(cold, dict) and cold:
        phases = ", ".join(f"{k} {duration(v)}" for k, v in cold.items() if k != "placed")
        rows.append(("cold start", escape(phases)))
    if job.get("requests") is not None:
        rows.append(
            (
                "requests",
                f"{job.get('requests')} ({job.get('errors') or 0} errors), "
                f"{_bytes(job.get('bytes_in'))} in, {_bytes(job.get('bytes_out'))} out",
            )
        )
    return rows


def job_detail(job: dict[str, Any]) -> None:
    """Header, state history and log tail of `job show`."""
    cost = job.get("cost")
    cost_text = f"{cost} credits" if cost is not None else f"- ({job.get('cost_note', '')})"
    rate = job.get("rate")
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    cpu = cpu_only(job)
    head.add_row("job", f"{text(job.get('id'))}  {text(job.get('name'))}")
    if job.get("state") == "queued":
        head.add_row("state", state("queued", cpu) + f": {text(job.get('queue_reason'))}")
    elif job.get("progress"):  # starting (its data fetched) or uploading (its output put)
        head.add_row("state", state(job.get("state")) + f": {text(job.get('progress'))}")
    else:
        head.add_row("state", state(job.get("state")))
    waiting = [w for w in _dicts(job.get("workers")) if w.get("state") == "waiting"]
    if waiting and job.get("state") != "queued":
        # Some workers run, others still wait for GPUs or CPUs (R-JOB-5): say why they wait.
        head.add_row(
            "waiting",
            f"{len(waiting)} worker(s): {text(job.get('queue_reason') or 'not yet considered')}",
        )
    head.add_row("node(s)", escape(_nodes(job)))
    unit = "CPU-hour" if cpu else "GPU-hour"
    head.add_row("rate", f"{text(rate)} credits/{unit}" if rate else "-")
    head.add_row("run time", duration(run_seconds(job)))
    head.add_row("cost", escape(cost_text))
    for label, value in endpoint_rows(job):
        head.add_row(label, value)
    console = out()
    console.print(head)

    # The tables below keep their reasons whole: reasons wrap before times shorten, and the
    # workers table gives up, in this order, Rate/h, reasons on one line, GPUs, Run time.
    history = _dicts(job.get("history"))
    cols = [
        Col("State", [state(h.get("state"), cpu) for h in history]),
        _time_col("Time", [h.get("at") for h in history]),
        Col("Reason", [text(h.get("reason")) for h in history], floor=20, wrap=True),
    ]
    steps: list[Step] = [("cut", "Reason"), ("short", "Time")]
    console.print(fitted(cols, steps, console.width, title="history"))

    detail = _dicts(job.get("queue_detail"))
    if detail and waiting:
        cols = [
            Col("Nodes", [text(d.get("nodes")) for d in detail]),
            Col("Ruled out because", [text(d.get("reason")) for d in detail], floor=20, wrap=True),
        ]
        steps = [("cut", "Ruled out because")]
        console.print(fitted(cols, steps, console.width, title="why waiting"))
    notes = _dicts(job.get("notes"))
    if notes:
        cols = [
            _time_col("Time", [n.get("at") for n in notes]),
            Col("Note", [text(n.get("note")) for n in notes], floor=20, wrap=True),
        ]
        steps = [("cut", "Note"), ("short", "Time")]
        console.print(fitted(cols, steps, console.width, title="notes"))

    workers = _dicts(job.get("workers"))
    if len(workers) > 1 or any(w.get("exit_code") is not None for w in workers):
        cols = [
            Col("Worker", [text(w.get("index")) for w in workers], justify="right"),
            Col("State", [state(w.get("state"), cpu) for w in workers]),
            Col("Node", [text(w.get("node")) for w in workers]),
            Col("GPUs", [escape(_worker_gpus(w)) for w in workers]),
            Col("Rate/h", [rates(w.get("rate")) for w in workers], justify="right"),
            Col("Run time", [duration(worker_seconds(w)) for w in workers], justify="right"),
            Col("Exit", [text(w.get("exit_code")) for w in workers], justify="right"),
            Col("Reason", [text(w.get("reason")) for w in workers], floor=16, wrap=True),
        ]
        steps = [("drop", "Rate/h"), ("cut", "Reason"), ("drop", "GPUs"), ("drop", "Run time")]
        console.print(fitted(cols, steps, console.width, title="workers"))

    tail = str(job.get("log_tail") or "")
    console.print(
        Panel(Text(tail.rstrip("\n") or "(no output yet)"), title="log tail", title_align="left")
    )


# As the terminal narrows `job list` gives up, in order: Nodes and Project (shown from about
# 120 columns), the full queue time (then 'HH:MM:SS' today, 'MM-DD HH:MM' before), the
# other GPU models a worker may get, the end of long names (Name is cut to 10 at least),
# Workers, Queued at, Rate/h and GPUs. ID, State, GPUs and Rate/h are never cut.
JOB_STEPS: list[Step] = [
    ("drop", "Nodes"),
    ("drop", "Project"),
    ("short", "Queued at"),
    ("short", "GPUs"),
    ("cut", "Name"),
    ("drop", "Workers"),
    ("drop", "Queued at"),
    ("drop", "Rate/h"),
    ("drop", "GPUs"),
]


def _owner(job: dict[str, Any]) -> str:
    """The account a job belongs to, and its creator when another account ran it."""
    owner, creator = job.get("owner"), job.get("creator")
    return text(owner if not creator or creator == owner else f"{owner} (by {creator})")


def job_table(jobs: list[dict[str, Any]], owners: bool = False) -> None:
    """`owners`: every account's jobs (an operator's view): an Account column, kept whole."""
    specs = [j["spec"] if isinstance(j.get("spec"), dict) else {} for j in jobs]
    nodes = [
        dict.fromkeys(str(w["node"]) for w in _dicts(j.get("workers")) if w.get("node"))
        for j in jobs
    ]
    cols = [
        Col("ID", [text(j.get("id")) for j in jobs]),
        *([Col("Account", [_owner(j) for j in jobs])] if owners else []),
        Col("Name", [_line(text(j.get("name"))) for j in jobs], floor=10),
        Col("Project", [text(j.get("project")) for j in jobs]),
        Col("State", [state(j.get("state"), cpu_only(j)) for j in jobs]),
        Col("Workers", [text(s.get("workers")) for s in specs], justify="right"),
        Col("GPUs", [escape(gpus(s)) for s in specs], short=[escape(gpus(s, True)) for s in specs]),
        Col("Nodes", [text(list(n) or None) for n in nodes]),
        Col("Rate/h", [rates(j.get("rate")) for j in jobs], justify="right"),
        _time_col("Queued at", [j.get("queued_at") for j in jobs]),
    ]
    console = out()
    console.print(fitted(cols, JOB_STEPS, console.width) if jobs else "no jobs")


def gpu_summary(gpus: Any) -> str:
    """'2xRTX 3090' (models counted, NVML name when not in the catalogue)."""
    counts = Counter(str(g.get("model") or g.get("nvml_name") or "?") for g in _dicts(gpus))
    return ", ".join(f"{n}{TIMES}{m}" for m, n in counts.items()) or "none"


def heartbeat(telemetry: Any) -> NodeHeartbeat | None:
    """A node's last heartbeat as the provisioner keeps it (`telemetry`), or None."""
    if not isinstance(telemetry, dict):
        return None
    try:
        return NodeHeartbeat.model_validate(telemetry)
    except ValidationError:
        return None


def _measures(*parts: tuple[str, Any, str]) -> str:
    """'CPU 12.5 %, RAM 10240 MB used': the values known, each with its label and unit."""
    return ", ".join(f"{pre}{v}{unit}" for pre, v, unit in parts if v is not None) or "-"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _pair(corrected: int | None, uncorrected: int | None) -> str:
    return f"{_count(corrected)}/{_count(uncorrected)}"


def gpu_health(g: GpuSample) -> str:
    """ECC counts, retired pages or remapped rows, and XIDs, where the GPU reports them."""
    parts = []
    if g.ecc_volatile_corrected is not None or g.ecc_volatile_uncorrected is not None:
        parts.append(
            "ECC corrected/uncorrected: "
            f"volatile {_pair(g.ecc_volatile_corrected, g.ecc_volatile_uncorrected)}, "
            f"aggregate {_pair(g.ecc_aggregate_corrected, g.ecc_aggregate_uncorrected)}"
        )
    if g.retired_pages is not None:
        parts.append(f"{g.retired_pages} pages retired")
    if g.remapped_rows_corrected is not None or g.remapped_rows_uncorrected is not None:
        rows = f"rows remapped {_pair(g.remapped_rows_corrected, g.remapped_rows_uncorrected)}"
        if g.remapped_rows_pending:
            rows += " (pending a reset)"
        if g.remapped_rows_failed:
            rows += " (remapping FAILED)"
        parts.append(rows)
    if g.xid_events:
        xids = ", ".join(f"{e.xid} at {when(e.at.isoformat())}" for e in g.xid_events)
        parts.append(f"XID {xids}")
    return "; ".join(parts)


def telemetry_rows(hb: NodeHeartbeat) -> list[tuple[str, str]]:
    """`node show`'s rows of the last heartbeat: the host, then each GPU (plain text)."""
    free = "" if hb.disk_free_gb is None else f" ({hb.disk_free_gb} GB free)"
    disk = None if hb.disk_used_pct is None else f"{hb.disk_used_pct} % used{free}"
    host = _measures(
        ("CPU ", hb.cpu_pct, " %"), ("RAM ", hb.ram_used_mb, " MB used"), ("disk ", disk, "")
    )
    rows = [("host", host)]
    if hb.disk_read_bytes is not None and hb.disk_write_bytes is not None:
        io = f"{hb.disk_read_bytes} B read, {hb.disk_write_bytes} B written since boot"
        rows.append(("disk I/O", io))
    for g in hb.gpus:
        live = _measures(
            ("", g.utilization_pct, " % busy"),
            ("", g.memory_used_mb, " MB used"),
            ("", g.temperature_c, " C"),
            ("", g.power_w, " W"),
        )
        health = gpu_health(g)
        rows.append((f"gpu {g.index}", live + (f"; {health}" if health else "")))
    return rows


# `node list` gives up, in order: Minion and Kind (wide terminals), the full time of the last
# heartbeat, Simulated, Last seen, Region. Name (an id), State and GPUs are never cut.
NODE_STEPS: list[Step] = [
    ("drop", "Minion"),
    ("drop", "Verified"),
    ("drop", "Kind"),
    ("short", "Last seen"),
    ("drop", "Simulated"),
    ("drop", "Last seen"),
    ("drop", "Region"),
]


def _verified(node: dict[str, Any]) -> str:
    if "verified" not in node:
        return "-"
    return "yes" if node["verified"] else "no"


def node_table(nodes: list[dict[str, Any]]) -> None:
    cols = [
        Col("Name", [text(n.get("name")) for n in nodes]),
        Col("Minion", [text(n.get("minion_id")) for n in nodes]),
        Col("Region", [text(n.get("region")) for n in nodes]),
        Col("Kind", [text(n.get("kind")) for n in nodes]),
        Col("State", [state(n.get("state")) for n in nodes]),
        Col("GPUs", [escape(gpu_summary(n.get("gpus"))) for n in nodes]),
        Col("Simulated", ["yes" if n.get("simulated") else "no" for n in nodes]),
        # verified nodes: only these take other accounts' jobs ("-": never checked)
        Col("Verified", [_verified(n) for n in nodes]),
        _time_col("Last seen", [n.get("last_seen") for n in nodes]),
    ]
    console = out()
    console.print(fitted(cols, NODE_STEPS, console.width) if nodes else "no nodes")


# `billing entries` gives up, in order: Account (wide terminals), the full time, the end of
# long memos (cut to 12 at least), Worker, Memo, Kind, At. Amount and Job (an id) are never
# cut.
ENTRY_STEPS: list[Step] = [
    ("drop", "Account"),
    ("short", "At"),
    ("cut", "Memo"),
    ("drop", "Worker"),
    ("drop", "Memo"),
    ("drop", "Kind"),
    ("drop", "At"),
]


def entry_table(entries: list[dict[str, Any]]) -> None:
    cols = [
        _time_col("At", [e.get("at") for e in entries]),
        Col("Account", [text(e.get("account")) for e in entries]),
        Col("Kind", [text(e.get("kind")) for e in entries]),
        Col("Amount", [text(e.get("amount")) for e in entries], justify="right"),
        Col("Job", [text(e.get("job_id")) for e in entries]),
        Col("Worker", [text(e.get("worker")) for e in entries], justify="right"),
        Col("Memo", [_line(text(e.get("memo"))) for e in entries], floor=12),
    ]
    console = out()
    console.print(fitted(cols, ENTRY_STEPS, console.width) if entries else "no ledger entries")


def health_table(rows: list[dict[str, Any]]) -> None:
    """Service, Status and what it said (its collections, or why it is down), wrapped."""
    details = [r.get("collections") if r.get("status") != "down" else r.get("error") for r in rows]
    cols = [
        Col("Service", [text(r.get("service")) for r in rows]),
        Col("Status", [state(r.get("status")) for r in rows]),
        Col("Collections", [text(d) for d in details], floor=20, wrap=True),
    ]
    console = out()
    console.print(fitted(cols, [("cut", "Collections")], console.width))


# `dlq list` gives up, in order: the full time, Errors on one line (they wrap), Service (the
# subject names it), At. Seq, Subject and Reason are never cut.
DLQ_STEPS: list[Step] = [("short", "At"), ("cut", "Errors"), ("drop", "Service"), ("drop", "At")]


def dlq_table(records: list[dict[str, Any]]) -> None:
    errors = [
        "; ".join(
            f"{e.get('field', '')}: {e.get('message', e.get('error', ''))}"
            for e in _dicts(r.get("errors"))
        )
        for r in records
    ]
    cols = [
        Col("Seq", [text(r.get("seq")) for r in records], justify="right"),
        _time_col("At", [r.get("at") for r in records]),
        Col("Service", [text(r.get("service")) for r in records]),
        Col("Subject", [text(r.get("subject")) for r in records]),
        Col("Reason", [_line(text(r.get("reason"))) for r in records]),
        Col("Errors", [text(e) for e in errors], floor=16, wrap=True),
    ]
    console = out()
    console.print(
        fitted(cols, DLQ_STEPS, console.width) if records else "the dead-letter queue is empty"
    )
