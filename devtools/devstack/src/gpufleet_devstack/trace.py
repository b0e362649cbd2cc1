"""`just trace <job>`: one job's trace, as the sampled spans `just up`'s processes wrote it
(`<run dir>/traces/*.jsonl`, gpufleet_telemetry.spanfile), an indented tree.

Only a sampled job has spans (GPUFLEET_TRACE_SAMPLE_RATIO, 0.1 by default: `just up` with
GPUFLEET_TRACE_SAMPLE_RATIO=1 samples every job). Spans reach the files within seconds of
ending (the batch processor's delay)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet_telemetry.spanfile import read_spans, trace_of_job, tree

from .config import run_dir_from_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="just trace", description=__doc__)
    parser.add_argument("job", help="the job's id (gpufleet job list)")
    parser.add_argument("--dir", type=Path, help="where the spans are (default: <run dir>/traces)")
    args = parser.parse_args(argv)
    directory = args.dir or run_dir_from_env() / "traces"
    spans = trace_of_job(read_spans(directory), args.job)
    if not spans:
        print(f"no spans of job {args.job} in {directory} (not sampled, or not written yet)")
        return 1
    print(f"trace {spans[0]['trace_id']}")
    for line in tree(spans):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
