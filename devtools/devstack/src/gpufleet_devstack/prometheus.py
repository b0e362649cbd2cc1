"""A real Prometheus (Debian's `prometheus`) scraping gpufleet's `/metrics`, as a child.

`just up` runs one over every service's and the node agent's metrics port, its data under the
run directory; the tests start one on a free port with `running_prometheus` and ask it with
`query`. Every gpufleet target is scraped by one scrape job, `gpufleet_scrape_job`, which
compose's deploy/prometheus/prometheus.yml repeats (a unit test compares them).

The `job` label. A GPU series names the gpufleet job holding the GPU in its own `job` label,
which Prometheus would otherwise overwrite with the scrape job's name. `honor_labels` keeps
the series' own, and the relabelling drops the scrape job's name where a series had none (an
idle GPU, a service's series): in Prometheus a gpufleet series' `job` is a gpufleet job or
absent (`job=""` matches both an idle GPU and a series without one). `up` and the other
series Prometheus makes itself keep `job="gpufleet"`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpufleet_devstack._server import ServerProcess
from gpufleet_devstack.processes import DevstackError, apt_install

__all__ = [
    "PACKAGE",
    "PrometheusServer",
    "ensure_prometheus",
    "find_prometheus",
    "gpufleet_scrape_job",
    "prometheus_config",
    "query",
    "running_prometheus",
    "start_prometheus",
]

PACKAGE = "prometheus"
INSTALL_HINT = f"install it with `sudo apt-get install -y {PACKAGE}` (or `just setup`)"
SCRAPE_JOB = "gpufleet"


def find_prometheus() -> str | None:
    return shutil.which(PACKAGE) or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )


def ensure_prometheus(log: Callable[[str], None] = print) -> bool:
    """Install prometheus when missing and we are root; else say how. Never fatal: only the
    metrics' history needs it."""
    if find_prometheus() or (apt_install([PACKAGE], log) and find_prometheus()):
        return True
    log(f"no metrics history without {PACKAGE}: {INSTALL_HINT}")
    return False


def gpufleet_scrape_job(targets: Sequence[str], scrape_interval_s: float) -> dict[str, Any]:
    """The scrape job of gpufleet's targets (`host:port` of each /metrics)."""
    return {
        "job_name": SCRAPE_JOB,
        "scrape_interval": _duration(scrape_interval_s),
        "scrape_timeout": _duration(min(scrape_interval_s, 10.0)),
        "honor_labels": True,
        "static_configs": [{"targets": list(targets)}],
        "metric_relabel_configs": [
            {
                "source_labels": ["job"],
                "regex": SCRAPE_JOB,
                "target_label": "job",
                "replacement": "",
            }
        ],
    }


def prometheus_config(
    targets: Sequence[str], scrape_interval_s: float, rule_files: Sequence[Path] = ()
) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": _duration(scrape_interval_s),
            "evaluation_interval": _duration(scrape_interval_s),
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [gpufleet_scrape_job(targets, scrape_interval_s)],
    }


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


class PrometheusServer(ServerProcess):
    """prometheus on `host:port` (a free one by default), its TSDB under `data_dir`, scraping
    `targets` every `scrape_interval_s`; `url` is its HTTP API and UI."""

    kind = "prometheus"

    def __init__(
        self,
        data_dir: Path,
        targets: Sequence[str],
        scrape_interval_s: float = 5.0,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        rule_files: Sequence[Path] = (),
        retention: str = "15d",
        start_timeout: float = 30.0,
    ) -> None:
        data_dir = Path(data_dir).absolute()
        super().__init__(
            host=host,
            port=port,
            log_file=data_dir.parent / f"{data_dir.name}.prometheus.log",
            start_timeout=start_timeout,
        )
        self.data_dir = data_dir
        self.targets = list(targets)
        self.scrape_interval_s = scrape_interval_s
        self.rule_files = list(rule_files)
        self.retention = retention
        self.config_file = data_dir.parent / f"{data_dir.name}.prometheus.yml"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = prometheus_config(self.targets, self.scrape_interval_s, self.rule_files)
        self.config_file.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML

    def _argv(self) -> list[str]:
        binary = find_prometheus()
        if binary is None:
            raise FileNotFoundError(f"{PACKAGE} is not installed: {INSTALL_HINT}")
        return [
            binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address={self.host}:{self.port}",
            "--web.enable-lifecycle",  # POST /-/reload after the config changed
            "--log.level=warn",
        ]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def reload(self) -> None:
        """Write the config again (targets or rule files changed) and have it read."""
        self._prepare()
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=5):
            pass


def start_prometheus(
    targets: Sequence[str],
    dir: Path,
    scrape_interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
) -> tuple[str, PrometheusServer]:
    """A Prometheus on a free port scraping `targets` (`host:port`), its files under `dir`;
    returns its URL and the server (call `stop()`)."""
    server = PrometheusServer(
        Path(dir) / "prometheus", targets, scrape_interval_s, rule_files=rule_files
    )
    server.start()
    return server.url, server


@contextlib.contextmanager
def running_prometheus(
    targets: Sequence[str],
    dir: Path,
    scrape_interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
) -> Iterator[PrometheusServer]:
    """`start_prometheus` for a block: stopped when it ends."""
    _, server = start_prometheus(targets, dir, scrape_interval_s, rule_files)
    try:
        yield server
    finally:
        server.stop()


def query(url: str, expr: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """An instant query's result (`data.result`: each `{"metric": labels, "value": [t, v]}`)."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as r:
            body = json.load(r)
    except urllib.error.HTTPError as exc:
        raise DevstackError(f"prometheus refused {expr!r}: {exc.read().decode()}") from exc
    if body.get("status") != "success":
        raise DevstackError(f"prometheus query {expr!r} failed: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result
