"""The benchmark's JSON as markdown tables (gpufleet and Slurm side by side)."""

from __future__ import annotations

from typing import Any


def _v(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        x = f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"
    return f"{x}{unit}"


def markdown(out: dict[str, Any]) -> str:
    return idle(out) if out.get("kind") == "idle" else lifecycle(out)


def lifecycle(out: dict[str, Any]) -> str:
    s, g, sl = out["settings"], out.get("gpufleet", {}), out.get("slurm")
    b, c = g.get("billing", {}), g.get("cpu", {})
    slurm_ok = bool(sl and sl.get("ran"))
    head = f"N={s['nodes']} nodes x 8 GPUs, M={s['jobs']} jobs `true`, runtime {s['runtime']}"
    rows = [
        (
            "submit rate (jobs/s)",
            _v(g.get("submit", {}).get("per_s")),
            sl and sl.get("submit_per_s"),
        ),
        ("started", f"{g.get('started')} of {g.get('jobs')}", s["jobs"] if slurm_ok else None),
        ("started/s", _v(g.get("started_per_s")), sl and sl.get("started_per_s")),
        ("finished/s", _v(g.get("finished_per_s")), sl and sl.get("completed_per_s")),
        ("all finished after (s)", _v(g.get("all_finished_s")), sl and sl.get("all_completed_s")),
        ("submit->running p50 / p99 (ms)", _lat(g.get("submit_to_running")), None),
        ("submit->finished p50 / p99 (ms)", _lat(g.get("submit_to_finished")), None),
        ("failed / not ended", f"{g.get('failed')} / {g.get('not_ended')}", None),
        ("billed exactly once per run", _v(b.get("exactly_one_usage_charge_per_run")), None),
        ("billed after last finish (s)", _v(b.get("billed_after_last_finish_s")), None),
        ("jobs charged twice", _v(b.get("jobs_charged_more_than_once")), None),
        ("jobs run twice (at once)", _twice(g.get("doubled")), None),
        ("nodes marked lost", _v(g.get("nodes_lost")), None),
        ("machine CPU busy (cores)", _v(c.get("machine_busy_cores")), _busy(sl, s["cpus"])),
    ]
    lines = [f"### {head}", "", "| same run | gpufleet | Slurm |", "|---|---|---|"]
    lines += [f"| {k} | {gv} | {_v(sv) if sv is not None else '-'} |" for k, gv, sv in rows]
    if sl and not sl.get("ran"):
        lines += ["", f"Slurm: not run ({sl.get('why')})."]
    for why, n in (g.get("workers_not_finished") or {}).items():
        lines.append(f"\nWorkers that ended otherwise than finished: {n} x {why}")
    lines += ["", f"CPU seconds per finished job ({c.get('method')}):", ""]
    lines += ["| process group | CPU-s | per job |", "|---|---|---|"]
    for group, v in (c.get("by_group") or {}).items():
        lines.append(f"| {group} | {_v(v['cpu_s'])} | {v['per_job_s']:.4f} |")
    lines.append(f"| machine (all) | | {c.get('machine_cpu_s_per_job')} |")
    lines.append(
        f"| the job itself (`true`, calibrated) | | {g.get('job_itself_cpu_s_calibrated')} |"
    )
    return "\n".join(lines)


def _lat(st: dict[str, Any] | None) -> str:
    return f"{_v(st['p50_ms'])} / {_v(st['p99_ms'])}" if st and st.get("n") else "-"


def _twice(d: dict[str, int] | None) -> str:
    return f"{d['jobs_run_more_than_once']} ({d['jobs_run_twice_at_once']})" if d else "-"


def _busy(sl: dict[str, Any] | None, cpus: int) -> float | None:
    """The harness's mean CPU busy % of the host (vmstat) as cores."""
    if sl and sl.get("cpu_busy_pct") is not None:
        return round(float(sl["cpu_busy_pct"]) / 100 * cpus, 2)
    return None


def idle(out: dict[str, Any]) -> str:
    k = out["settings"]["idle_agents"]
    g = out.get("gpufleet", {})
    a = g.get("node_agent", {})
    sl = out.get("slurm") or {}
    d = sl.get("slurmd", {}) if sl.get("measured") else {}
    lines = [
        f"### {k} idle agents (simulated 8 GPUs each) vs {k} idle slurmd",
        "",
        "| per process, idle | node agent | slurmd |",
        "|---|---|---|",
        f"| CPU % mean / p99 | {_v(a.get('cpu_pct_mean'))} / {_v(a.get('cpu_pct_p99'))} "
        f"| {_v(d.get('cpu_pct_mean'))} / {_v(d.get('cpu_pct_p99'))} |",
        f"| RSS MiB mean / p99 | {_v(a.get('rss_mib_mean'))} / {_v(a.get('rss_mib_p99'))} "
        f"| {_v(d.get('rss_mib_mean'))} / {_v(d.get('rss_mib_p99'))} |",
        f"| all of them, CPU % | {_v(g.get('all_agents_cpu_pct'))} | "
        f"{_v(d['cpu_pct_mean'] * d['count']) if d else '-'} |",
        f"| machine busy cores (before: {_v(out.get('machine_before', {}).get('busy_cores'))}) "
        f"| {_v(g.get('machine_with_agents', {}).get('busy_cores'))} "
        f"| {_v(sl.get('machine_busy_cores'))} |",
        f"| load average 1 min | {_v(g.get('machine_with_agents', {}).get('loadavg_1m'))} | - |",
    ]
    if sl and not sl.get("measured"):
        lines += ["", f"slurmd: not measured ({sl.get('why')})."]
    lines += ["", f"Services while the agents idle, CPU %: {g.get('services_cpu_pct')}"]
    return "\n".join(lines)
