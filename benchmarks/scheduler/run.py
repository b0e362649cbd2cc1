"""Run every scheduler benchmark and record its JSON under results/ (see README.md).

just bench-scheduler            # all three, full size (~10 minutes on 2 cores)
just bench-scheduler --quick    # smaller sizes, a minute or two
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


def run(name: str, args: list[str]) -> None:
    print(f"== {name} {' '.join(args)}", flush=True)
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, str(HERE / f"{name}.py"), *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=HERE,
    ).stdout
    result = json.loads(out[out.rindex("\n{") + 1 :] if "\n{" in out else out)
    result["wall_s"] = round(time.time() - t0, 1)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, a minute or two")
    quick = ap.parse_args().quick
    run("bench_placement", ["--jobs", "20000", "--naive-jobs", "300"] if quick else [])
    run("bench_quality", ["--instances", "100"] if quick else [])
    run(
        "bench_e2e",
        ["--jobs", "1000", "--latency-seconds", "5", "--restart-jobs", "10000"] if quick else [],
    )


if __name__ == "__main__":
    main()
