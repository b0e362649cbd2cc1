"""`just up --data`'s demo: a small dataset archive (three CSV files, made here, the same
bytes every time), a model repository whose train.py fits it, a platform checkpoint it
starts from, and the job that runs one on the other; with the servers' endpoints filled in
(servers.py)."""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile
import zipfile
from collections.abc import Mapping
from typing import Final

DATASET: Final = "demo-dataset.tar.gz"
BUCKET: Final = "demo"  # the S3 and GCS bucket, and the Azure container
MODEL_REPO: Final = "demo-model.git"
JOB_NAME: Final = "demo-fit"
CHECKPOINT: Final = "demo-start"  # a platform checkpoint of the local account

# stdlib only: it runs in any base environment, and on the host as a bare process.
TRAIN_PY: Final = '''\
"""Fits y = a*x + b to the CSV files of /opt/ml/input (or a .tar.gz of them there) and
writes the model and its error to /opt/ml/output; says where it starts from when a
checkpoint is at /opt/ml/checkpoint (its start.json)."""

import csv
import io
import json
import os
import pathlib
import tarfile

INPUT = pathlib.Path(os.environ.get("ML_DATA_PATH", "/opt/ml/input"))
OUTPUT = pathlib.Path(os.environ.get("ML_OUTPUT_PATH", "/opt/ml/output"))
CHECKPOINT = pathlib.Path(os.environ.get("ML_CHECKPOINT_PATH", "/opt/ml/checkpoint"))


def tables():
    """Each CSV file's rows by its name, from the input directory or its archives."""
    found = {}
    for path in sorted(INPUT.rglob("*")):
        if path.suffix == ".csv":
            found[path.name] = list(csv.DictReader(path.open()))
        elif path.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(path) as archive:
                for member in archive.getmembers():
                    if member.isfile() and member.name.endswith(".csv"):
                        text = archive.extractfile(member).read().decode()
                        found[pathlib.Path(member.name).name] = list(
                            csv.DictReader(io.StringIO(text))
                        )
    return found


def fit(rows):
    xs = [float(r["x"]) for r in rows]
    ys = [float(r["y"]) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return a, my - a * mx


def main():
    start = CHECKPOINT / "start.json"
    if start.is_file():
        was = json.loads(start.read_text())
        print(f"checkpoint {was['name']}: from y = {was['a']} * x + {was['b']}")
    data = tables()
    a, b = fit(data["train.csv"])
    test = data.get("test.csv", data["train.csv"])
    mae = sum(abs(a * float(r["x"]) + b - float(r["y"])) for r in test) / len(test)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "model.json").write_text(json.dumps({"a": a, "b": b}) + "\\n")
    (OUTPUT / "metrics.json").write_text(json.dumps({"test_mae": mae}) + "\\n")
    print(f"y = {a:.3f} * x + {b:.3f}; mean absolute error on {len(test)} rows: {mae:.3f}")


if __name__ == "__main__":
    main()
'''

# The demo endpoint's routes (endpoint_yaml): functions of the request's JSON body.
APP_PY: Final = '''\
"""The demo endpoint's routes: each function gets the request body's parameters."""


def add(a, b):
    return {"sum": a + b}


def line(x, a=3.0, b=2.0):
    """y = a * x + b: by default the line the demo dataset follows."""
    return {"y": a * x + b}
'''

MODEL_FILES: Final[Mapping[str, str]] = {
    "train.py": TRAIN_PY,
    "app.py": APP_PY,
    "README.md": "# demo-model\n\n`python train.py` fits the demo dataset of `just up --data`; "
    "`app.py` holds the demo endpoint's routes.\n",
}
ENDPOINT_NAME: Final = "demo-adder"


def _csv(rng: random.Random, rows: int) -> bytes:
    lines = ["x,y"]
    for _ in range(rows):
        x = rng.uniform(0, 10)
        lines.append(f"{x:.4f},{3 * x + 2 + rng.gauss(0, 0.5):.4f}")
    return ("\n".join(lines) + "\n").encode()


def checkpoint_archive() -> bytes:
    """The demo checkpoint, a zip as platform objects are (the same bytes every time):
    start.json, the line train.py starts from."""
    start = json.dumps({"name": CHECKPOINT, "a": 1.0, "b": 0.0}) + "\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        info = zipfile.ZipInfo("start.json", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        archive.writestr(info, start)
    return out.getvalue()


def dataset_archive() -> bytes:
    """The demo dataset: train.csv, valid.csv and test.csv (y = 3x + 2 with noise) in a
    tar.gz whose bytes are the same every time (fixed seed, times and owners)."""
    rng = random.Random(27)
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, rows in (("train.csv", 200), ("valid.csv", 50), ("test.csv", 50)):
            data = _csv(rng, rows)
            info = tarfile.TarInfo(f"demo-dataset/{name}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(tar_bytes.getvalue(), mtime=0)


def job_yaml(s3_url: str, git_http_url: str, azure_account_url: str) -> str:
    """The demo job, as a file for `gpufleet job submit -f`: its input from S3, its code
    from git over http, a platform checkpoint, its outputs to Azure Blob."""
    return f"""\
# The demo job of `just up --data`: {JOB_NAME} fits the demo dataset.
#   uv run gpufleet job submit -f <this file>
name: {JOB_NAME}
type: inference
gpu_types: ["RTX 3090"]
gpu_count: 1
# The dataset archive, from the local S3 (moto). An S3 API at an endpoint of one's own is
# the `wasabi` type (`aws` has no endpoint); the key: `gpufleet key add wasabi`.
input_data:
  type: wasabi
  path: s3://{BUCKET}/{DATASET}
  endpoint: {s3_url}
# The code, cloned from a bare repository served over http (git http-backend).
model:
  source: git
  path: {git_http_url}
# A checkpoint of your account's (put there by `just up --data`; `gpufleet checkpoint
# list`), unpacked at /opt/ml/checkpoint.
checkpoints:
  - name: {CHECKPOINT}
# /opt/ml/output, uploaded as {JOB_NAME}.zip to the local Azure Blob (Azurite, https with
# the stack's CA); the key: `gpufleet key add azure`.
output_data:
  type: azure
  path: {azure_account_url}/{BUCKET}/outputs/
environment:
  keys: [wasabi, azure]
command: [python, /opt/ml/models/train.py]
"""


def endpoint_yaml(git_http_url: str) -> str:
    """The demo endpoint, as a file for `gpufleet job submit -f`: two routes of app.py in the
    demo model's repository, served by gpufleet's route server."""
    return f"""\
# The demo endpoint of `just up --data`: {ENDPOINT_NAME} serves two functions of app.py.
#   uv run gpufleet job submit -f <this file>
name: {ENDPOINT_NAME}
type: endpoint
gpu_types: ["RTX 3090"]
gpu_count: 1
model: {{source: git, path: "{git_http_url}"}}  # holds app.py
endpoint:
  routes:
    - path: /sum            # POST only
      file: app.py          # relative to the model code
      function: add         # add(a, b): called by keyword (positional: true, in order)
      body:
        - {{name: a, type: integer}}
        - {{name: b, type: integer, optional: true, default: "2"}}
    - path: /line
      file: app.py
      function: line
      positional: true      # line(x, a, b), in this order
      body:
        - {{name: x, type: float}}
        - {{name: a, type: float, optional: true, default: "3.0"}}
        - {{name: b, type: float, optional: true, default: "2.0"}}
"""
