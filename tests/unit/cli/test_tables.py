"""The tables of the CLI at the width of a real terminal (issue 25): `job list`, `billing
entries` and `node list` run in a child process whose output is a pseudo-terminal of 80 or
160 columns (TERM=xterm, no COLUMNS), the services' replies canned."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gpufleet_cli import client, views
from gpufleet_cli.main import app
from rich.cells import cell_len
from typer.testing import CliRunner

from .replies import job, node

TIMES = views.TIMES
NOW = datetime.now(UTC)
TODAY = (NOW - timedelta(minutes=5)).isoformat()
BEFORE = "2025-11-26T06:41:01+00:00"

JOBS: list[dict[str, Any]] = [
    job(
        **{
            "id": "j1c9854011370",
            "name": "resnet50-imagenet-sweep-3",  # 25 characters: may be cut, never wrapped
            "project": "default",
            "owner": "acme",
            "state": "queued",
            "rate": None,
            "spec": {"gpu_types": ["RTX 3090"], "gpu_count": 1, "workers": 1},
            "workers": [{"index": 0, "state": "waiting"}],
            "queued_at": TODAY,
        }
    ),
    job(
        **{
            "id": "j5f0e1d2c3b4a",
            "name": "cpu-preprocess",
            "project": "acme/research",
            "owner": "acme",
            "state": "queued",
            "rate": None,
            "spec": {"gpu_types": [], "gpu_count": 0, "cpu_count": 4, "workers": 2},
            "workers": [],
            "queued_at": BEFORE,
        }
    ),
    job(
        **{
            "id": "j0123456789ab",
            "name": "llm finetune",
            "project": "default",
            "owner": "acme",
            "state": "running",
            "rate": "0.0125",
            "spec": {
                "gpu_types": ["RTX 3090"],
                "gpu_count": 1,
                "gpu_fraction": "0.5",
                "workers": 1,
            },
            "workers": [{"index": 0, "state": "running", "node": "local-node-1"}],
            "queued_at": BEFORE,
        }
    ),
    job(
        **{
            "id": "jabcdefabcdef",
            "name": "ddp",
            "project": "default",
            "owner": "acme",
            "state": "finished",
            "rate": "0.05",
            "spec": {"gpu_types": ["RTX 3090"], "gpu_count": 2, "workers": 2},
            "workers": [
                {"index": 0, "state": "finished", "node": "local-node-1"},
                {"index": 1, "state": "finished", "node": "local-node-2"},
            ],
            "queued_at": BEFORE,
        }
    ),
]
ENTRIES: list[dict[str, Any]] = [
    {
        "key": "k1",
        "account": "acme",
        "kind": "market_price",
        "amount": "-0.000014",
        "amount_micro": -14,
        "job_id": "j1c9854011370",
        "worker": 0,
        "at": TODAY,
        "memo": "1 x RTX 3090 at 0.05/GPU-hour, run of 1.012s on bob's node",
    },
    {
        "key": "k2",
        "account": "acme",
        "kind": "usage_fee",
        "amount": "-0.000139",
        "amount_micro": -139,
        "job_id": "j0123456789ab",
        "worker": 11,
        "at": BEFORE,
        "memo": "8 CPUs at 0.0125/CPU-hour,\nhour 3",
    },
    {
        "key": "k3",
        "account": "earnings:acme",
        "kind": "payout",
        "amount": "12.500000",
        "amount_micro": 12500000,
        "job_id": "jabcdefabcdef",
        "worker": None,
        "at": BEFORE,
        "memo": "earnings up to the end of 2025-11-25",
    },
]
GPU: dict[str, Any] = {"index": 0, "model": "RTX 3090", "nvml_name": "NVIDIA GeForce RTX 3090"}
NODES: list[dict[str, Any]] = [
    node(
        node_id="n1",
        minion_id="minion-7f3a9c",
        name="local-node-1",
        region="eu-west",
        kind="compute",
        state="active",
        gpus=[GPU, {**GPU, "index": 1}],
        simulated=True,
        last_seen=TODAY,
    ),
    node(
        node_id="n2",
        minion_id="minion-0c1d2e",
        name="gpu-box-eu-west-17",
        region="us-east-2",
        kind="compute",
        state="maintenance",
        gpus=[GPU],
        simulated=False,
        last_seen=BEFORE,
    ),
]

# The child: every request answered with the canned reply, then the command itself.
CHILD = """
import json, sys
from gpufleet_cli import client
from gpufleet_cli.main import app
reply = json.loads(sys.argv[1])
client.request = lambda *args, **kwargs: reply
app(sys.argv[2:], prog_name="gpufleet")
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def on_terminal(columns: int, reply: dict[str, Any], *args: str) -> list[str]:
    """The lines a `gpufleet ARGS` prints on a terminal `columns` wide (colours stripped)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env = {k: v for k, v in env.items() if not k.startswith(("FORCE_COLOR", "NO_COLOR", "TTY_"))}
    env.update(TERM="xterm", GPUFLEET_ACCOUNT="acme")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(reply), *args],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed its terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr.decode()
    text = ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")
    return text.rstrip("\n").split("\n")


def rows(lines: list[str]) -> tuple[str, list[str]]:
    """The header line and the data lines (those after the rule under the header)."""
    rule = next(i for i, line in enumerate(lines) if line.strip() and set(line.strip()) == {"─"})
    return lines[rule - 1], lines[rule + 1 :]


def assert_fits(lines: list[str], columns: int, ids: list[str]) -> list[str]:
    """No line wider than the terminal, one line per record, each id whole on its row."""
    assert all(cell_len(line) <= columns for line in lines), "\n".join(lines)
    _, data = rows(lines)
    assert len(data) == len(ids), "\n".join(lines)  # no row wrapped to a second line
    for row, full_id in zip(data, ids, strict=True):
        assert re.search(rf"(^|\s){re.escape(full_id)}(\s|$)", row), (full_id, row)
    return data


def test_job_list_at_80_and_160_columns() -> None:
    reply = {"jobs": JOBS}
    narrow = on_terminal(80, reply, "job", "list")
    data = assert_fits(narrow, 80, [j["id"] for j in JOBS])
    assert "waiting for GPUs" in data[0]
    assert "waiting for CPUs" in data[1] and "4 CPUs" in data[1]
    assert f"0.5{TIMES}RTX 3090" in data[2] and "0.0125" in data[2]  # rates exact, whole
    assert f"2{TIMES}RTX 3090" in data[3] and "0.05" in data[3]
    assert "resnet50-" in data[0] and "llm finetune" in data[2]  # a long name is cut, a short not
    wide = on_terminal(160, reply, "job", "list")
    header, data = rows(wide)
    assert_fits(wide, 160, [j["id"] for j in JOBS])
    for extra in ("Project", "Nodes", "Workers"):
        assert extra in header and extra not in rows(narrow)[0]
    assert "resnet50-imagenet-sweep-3" in data[0]  # the whole name
    assert "local-node-1, local-node-2" in data[3]
    assert BEFORE[:10] + " " in data[3]  # the full time


def test_billing_entries_at_80_and_160_columns() -> None:
    reply = {"entries": ENTRIES}
    narrow = on_terminal(80, reply, "billing", "entries")
    data = assert_fits(narrow, 80, [str(e["job_id"]) for e in ENTRIES])
    for row, e in zip(data, ENTRIES, strict=True):
        assert re.search(rf"(^|\s){re.escape(str(e['amount']))}(\s|$)", row)  # exact amounts
    assert "market_price" in data[0]
    wide = on_terminal(160, reply, "billing", "entries")
    header, data = rows(wide)
    assert_fits(wide, 160, [str(e["job_id"]) for e in ENTRIES])
    assert "Account" in header and "Account" not in rows(narrow)[0]
    assert "earnings:acme" in data[2]
    assert "run of 1.012s on bob's node" in data[0]  # the whole memo
    assert "8 CPUs at 0.0125/CPU-hour, hour 3" in data[1]  # on one line


def test_node_list_at_80_and_160_columns() -> None:
    reply = {"nodes": NODES}
    narrow = on_terminal(80, reply, "node", "list")
    data = assert_fits(narrow, 80, [n["name"] for n in NODES])
    assert f"2{TIMES}RTX 3090" in data[0] and "active" in data[0]
    assert "maintenance" in data[1]
    wide = on_terminal(160, reply, "node", "list")
    header, data = rows(wide)
    assert_fits(wide, 160, [n["name"] for n in NODES])
    for extra in ("Minion", "Kind"):
        assert extra in header and extra not in rows(narrow)[0]
    assert "minion-7f3a9c" in data[0]


def test_the_narrow_table_gives_up_columns_in_its_order() -> None:
    """`job list` drops what matters least first, and never cuts an id or a state."""
    cols = [
        views.Col("ID", ["j1c9854011370"]),
        views.Col("Name", ["a-rather-long-job-name-here"], floor=10),
        views.Col("State", ["waiting for GPUs"]),
        views.Col("Extra", ["x" * 30]),
    ]
    steps: list[views.Step] = [("drop", "Extra"), ("cut", "Name"), ("drop", "Name")]
    wide = views.fitted(cols, steps, 200)
    assert [c.header for c in wide.columns] == ["ID", "Name", "State", "Extra"]
    mid = views.fitted(cols, steps, 60)
    assert [c.header for c in mid.columns] == ["ID", "Name", "State"]
    assert [c.width for c in mid.columns] == [13, 27, 16]  # fits whole: nothing cut
    cut = views.fitted(cols, steps, 50)
    assert [c.width for c in cut.columns] == [13, 50 - 13 - 16 - 4, 16]
    assert [c.header for c in views.fitted(cols, steps, 35).columns] == ["ID", "State"]


def test_formats() -> None:
    assert views.gpus({"gpu_types": ["RTX 3090"], "gpu_count": 1}) == f"1{TIMES}RTX 3090"
    assert views.gpus({"gpu_types": ["T4"], "gpu_count": 1, "gpu_fraction": "0.50"}) == (
        f"0.5{TIMES}T4"
    )
    assert views.gpus({"gpu_types": [], "gpu_count": 0, "cpu_count": 8}) == "8 CPUs"
    two = {"gpu_types": ["RTX 3090", "RTX 4090", "T4"], "gpu_count": 2}
    assert views.gpus(two) == f"2{TIMES}RTX 3090/RTX 4090/T4"
    assert views.gpus(two, short=True) == f"2{TIMES}RTX 3090/+2"
    assert views.rates("0.0125") == "0.0125"
    assert views.rates(["0.25", "0.05", "0.125"]) == "0.05-0.25"
    assert views.rates(None) == "-"


@pytest.fixture
def cpu_job() -> dict[str, Any]:
    return {
        **JOBS[1],
        "queue_reason": "no node has 4 free CPUs",
        "history": [{"state": "queued", "at": BEFORE, "reason": None}],
        "notes": [],
        "workers": [{"index": 0, "state": "waiting"}, {"index": 1, "state": "waiting"}],
    }


def test_a_cpu_only_job_waits_for_cpus_in_list_and_show(
    monkeypatch: pytest.MonkeyPatch, cpu_job: dict[str, Any]
) -> None:
    runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "120"})
    monkeypatch.setattr(client, "request", lambda *a, **k: {"jobs": [cpu_job]})
    listed = runner.invoke(app, ["job", "list"])
    (row,) = rows(listed.stdout.rstrip("\n").split("\n"))[1]
    assert "waiting for CPUs" in row and "GPUs" not in row
    monkeypatch.setattr(client, "request", lambda *a, **k: cpu_job)
    monkeypatch.setattr(client, "read_logs", lambda job_id: [])
    shown = runner.invoke(app, ["job", "show", cpu_job["id"]])
    assert shown.exit_code == 0, shown.output
    assert "waiting for CPUs: no node has 4 free CPUs" in shown.stdout
    history = shown.stdout.split("history", 1)[1]
    assert "waiting for CPUs" in history and "waiting for GPUs" not in shown.stdout
