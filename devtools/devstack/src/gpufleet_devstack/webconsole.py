"""What the web console needs on a developer's machine (`just setup`): its charting library
(uPlot, from npm by the lock file in gateway/web) and, for its browser tests, Debian's
chromium (Playwright drives it; Playwright's own browser download is never used)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from gpufleet_devstack.config import find_repo_root

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_HINT = "install it with `sudo apt-get install -y chromium` (the console's browser tests)"


def web_dir() -> Path:
    return find_repo_root() / "gateway" / "web"


def chart_library() -> Path:
    return web_dir() / "node_modules" / "uplot" / "dist" / "uPlot.esm.js"


def _apt(package: str, log: Callable[[str], None]) -> None:
    cmd = ["apt-get", "install", "-y", package]
    log(f"running: {' '.join(cmd)}")
    if subprocess.run(cmd, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], check=False)
        subprocess.run(cmd, check=False)


def ensure_console(log: Callable[[str], None] = print) -> bool:
    """uPlot in gateway/web/node_modules (npm ci) and chromium (apt, when root). Never fatal:
    without them the console draws no charts, and its browser tests are skipped."""
    ok = True
    if not chart_library().exists():
        if shutil.which("npm") is None and os.geteuid() == 0:
            _apt("npm", log)
        if shutil.which("npm") is None:
            log("the console's charts need node and npm: apt-get install nodejs npm")
            ok = False
        else:
            log(f"installing the console's chart library into {web_dir()}/node_modules (npm ci)")
            cmd = ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"]
            subprocess.run(cmd, cwd=web_dir(), check=False)
            ok = chart_library().exists()
    if not CHROMIUM.exists():
        if os.geteuid() == 0:
            _apt("chromium", log)
        if not CHROMIUM.exists():
            log(f"no chromium: {CHROMIUM_HINT}")
            ok = False
    return ok
