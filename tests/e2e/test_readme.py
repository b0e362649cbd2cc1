"""The README's first hour, as a new user types it: `just up` (the devstack's own entry
point, as the `up` recipe runs it) in one terminal, the README's quick-start block and its
second-node block in another, then Ctrl-C, which must leave nothing of the stack behind.

The blocks are read from README.md itself, so the README and this test cannot drift. The
only changes made to them are those of a user who moved the stack: `.run/` becomes this
test's run directory (GPUFLEET_RUN_DIR) and NATS's port 4333 this test's."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gpufleet_devstack import wait_for
from gpufleet_devstack.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
UV_BIN = Path(sys.executable).parent  # .venv/bin: `uv run` would find the same gpufleet
JOB_ID = re.compile(r"\bj[0-9a-f]{12}\b")


def block(marker: str) -> list[str]:
    """The command lines of the ```sh block after `<!-- marker -->` in the README."""
    text = README.read_text()
    at = text.index(f"<!-- {marker} -->")
    body = text[at:].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in body.splitlines() if line.strip() and not line.startswith("#")]


@dataclass
class Up:
    proc: subprocess.Popen[str]
    run_dir: Path
    env: dict[str, str]
    output: Path

    def said(self) -> str:
        return self.output.read_text(errors="replace")

    def bash(self, script: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        """`script` in a new shell in the repository, as the user's second terminal."""
        return subprocess.run(
            ["bash", "-x", "-e", "-o", "pipefail", "-c", script],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(UV_BIN / "gpufleet"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def job(self, job_id: str) -> dict[str, object]:
        shown = self.cli("job", "show", job_id, "--json")
        assert shown.returncode == 0, shown.stderr
        data: dict[str, object] = json.loads(shown.stdout)
        return data


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("readme")
    run_dir = root / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(
        GPUFLEET_RUN_DIR=str(run_dir),
        GPUFLEET_NATS_PORT=str(free_port()),
        GPUFLEET_MONGO_PORT=str(free_port()),
        GPUFLEET_REGISTRY_PORT=str(free_port()),
        GPUFLEET_CONFIG_DIR=str(root / "config"),  # the user's ~/.config/gpufleet
        PATH=f"{UV_BIN}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="200",  # what `just up` prints: one line a command
    )
    output = root / "up.out"
    with output.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet_devstack.up"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    up = Up(proc, run_dir, env, output)
    try:
        wait_for(
            lambda: "Ctrl-C stops everything" in up.said() or proc.poll() is not None,
            timeout=240,
            interval=0.5,
        )
        assert proc.poll() is None, up.said()
        yield up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_up_says_what_to_try_with_the_cli_context_it_left(up: Up) -> None:
    said = up.said()
    assert "context `local` is current" in said
    assert "uv run gpufleet node list" in said
    assert "login --creds" not in said  # nothing to type before the first command
    # the registry's address is the one asked for, kept across restarts
    assert f"127.0.0.1:{up.env['GPUFLEET_REGISTRY_PORT']}" in said


def test_the_quickstart_block_runs_as_written(up: Up) -> None:
    lines = block("quickstart")
    assert any("job submit --name hello" in line for line in lines)
    done = up.bash("\n".join(lines))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    ids = re.findall(r"^\+ id=(j[0-9a-f]{12})$", done.stderr, re.M)
    assert len(ids) == 3, done.stderr
    hello, cpu_only, half = ids
    assert "\nhi\n" in f"\n{done.stdout}"  # `job logs --follow` of the hello job
    assert "no GPU needed" in done.stdout
    assert up.job(hello)["state"] == "finished"
    assert up.job(cpu_only)["state"] == "finished"
    assert up.job(cpu_only)["name"]  # made up for it
    wait_for(lambda: up.job(half)["state"] == "stopped", timeout=60, interval=0.5)


def test_a_command_that_does_not_exist_says_so_with_127(up: Up) -> None:
    submitted = up.cli("job", "submit", "--gpu-type", "RTX 3090", "--gpu-count", "1", "--", "pythn")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    wait_for(lambda: up.job(job_id)["state"] == "failed", timeout=120, interval=0.5)
    job = up.job(job_id)
    workers = job["workers"]
    assert isinstance(workers, list)
    assert workers[0]["exit_code"] == 127
    assert workers[0]["reason"] == "command not found: pythn"
    logs = up.cli("job", "logs", job_id)
    assert "command not found: pythn" in logs.stdout


def _at_80_columns(up: Up, *args: str) -> str:
    """A CLI command's output on a pseudo-terminal of 80 columns, as a user sees it."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    env = {k: v for k, v in up.env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [str(UV_BIN / "gpufleet"), *args],
        cwd=ROOT,
        env={**env, "TERM": "xterm"},
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed it
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    assert proc.returncode == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())
    return text.replace("\r\n", "\n")


def test_tables_fit_80_columns_with_whole_ids(up: Up) -> None:
    ids = [j["id"] for j in json.loads(up.cli("job", "list", "--json").stdout)["jobs"]]
    entries = json.loads(up.cli("billing", "entries", "--json").stdout)["entries"]
    charged = [e["job_id"] for e in entries if e.get("job_id")]
    assert ids and charged
    for args, whole in (
        (("job", "list"), ids),
        (("billing", "entries"), charged),
        (("node", "list"), ["local-node-1"]),
    ):
        shown = _at_80_columns(up, *args)
        lines = shown.splitlines()
        for line in lines:
            assert len(line) <= 80, f"{args}: {line!r}"
        for item in whole:  # each on one line, whole: it can be copied
            assert any(item in line for line in lines), f"{args}: {item} cut:\n{shown}"


def test_a_second_node_joins_with_the_readme_block(up: Up) -> None:
    port = up.env["GPUFLEET_NATS_PORT"]
    lines = [
        line.replace(".run/", f"{up.run_dir}/").replace("127.0.0.1:4333", f"127.0.0.1:{port}")
        for line in block("second-node")
    ]
    token_line, agent_line = lines
    log = up.run_dir / "agent-2.log"
    with log.open("w") as out:
        agent = subprocess.Popen(
            ["bash", "-e", "-c", f"{token_line}\n{agent_line}"],
            cwd=ROOT,
            env=up.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def joined() -> bool:
            nodes = json.loads(up.cli("node", "list", "--json").stdout)["nodes"]
            return any(n["name"] == "local-node-2" and n["state"] == "active" for n in nodes)

        try:
            wait_for(joined, timeout=60, interval=0.5)
        except TimeoutError:
            raise AssertionError(f"local-node-2 did not join:\n{log.read_text()}") from None
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)


def _leftovers(run_dir: Path, job_ids: list[str]) -> list[str]:
    """Processes, mounts, loop devices and containers (the OCI runtimes' state, cgroups,
    podman's) of the stack or of these jobs that are still there."""
    left = []
    for pattern in (
        "/run/gpufleet-agent/*/gpufleet-{}-*",  # crun's and runc's state, bundles
        "/sys/fs/cgroup/*/gpufleet/gpufleet-{}-*",  # cgroup v1 (crun's, made by the agent)
        "/sys/fs/cgroup/gpufleet/gpufleet-{}-*",  # cgroup v2
    ):
        for job_id in job_ids:
            left += [f"container: {p}" for p in Path("/").glob(pattern.format(job_id)[1:])]
    podman = subprocess.run(
        ["podman", "ps", "-a", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    left += [
        f"podman container: {n}" for n in podman.stdout.split() if any(i in n for i in job_ids)
    ]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(run_dir) in args:
                left.append(f"process {entry.name}: {args[:200]}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if str(run_dir) in line:
            left.append(f"mount: {line}")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False)
    left += [f"loop device: {line}" for line in loops.stdout.splitlines() if str(run_dir) in line]
    return left


def test_ctrl_c_stops_the_stack_and_the_local_nodes_workers(up: Up) -> None:
    jobs = [
        up.cli("job", "submit", "--gpu-type", "RTX 3090", "--gpu-count", "1", "--", "sleep", "600"),
        up.cli("job", "submit", "--gpu-type", "3090", "--gpu-count", "0.5", "--", "sleep", "600"),
        up.cli("job", "submit", "--gpu-count", "0", "--cpu-count", "4", "--", "sleep", "600"),
    ]
    ids = [j.stdout.strip() for j in jobs]
    assert all(JOB_ID.fullmatch(i) for i in ids), [j.stderr for j in jobs]
    wait_for(lambda: all(up.job(i)["state"] == "running" for i in ids), timeout=120, interval=0.5)
    os.killpg(up.proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
    assert up.proc.wait(timeout=90) == 0
    said = up.said()
    assert "stopping node-agent and its 3 running worker(s)" in said
    assert "3 worker(s) stopped" in said
    assert said.rstrip().endswith("stopped")
    assert _leftovers(up.run_dir, ids) == []
