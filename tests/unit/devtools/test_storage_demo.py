"""`just up --data`'s demo (gpufleet_devstack.storage.demo): the job file is a valid job
spec, the dataset and checkpoint archives are the same every time, and the model's train.py
fits the dataset, starting from the checkpoint."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.jobspec import StorageType
from gpufleet_devstack.storage import demo
from gpufleet_devstack.storage.servers import StoragePorts

pytestmark = pytest.mark.unit


def test_the_demo_job_is_a_valid_job_spec() -> None:
    text = demo.job_yaml(
        "http://127.0.0.1:5060",
        "http://127.0.0.1:5064/demo-model.git",
        "https://127.0.0.1:5062/devstoreaccount1",
    )
    spec = JobSpec.model_validate(yaml.safe_load(text))
    assert spec.input_data is not None and spec.output_data is not None
    assert spec.model is not None
    assert (spec.input_data.type, spec.input_data.path) == (
        StorageType.wasabi,
        "s3://demo/demo-dataset.tar.gz",
    )
    assert spec.input_data.endpoint == "http://127.0.0.1:5060"
    assert (spec.model.source, spec.model.path) == (
        StorageType.git,
        "http://127.0.0.1:5064/demo-model.git",
    )
    assert spec.output_data.type is StorageType.azure
    assert spec.output_data.path == "https://127.0.0.1:5062/devstoreaccount1/demo/outputs/"
    assert spec.environment.keys == ["wasabi", "azure"]
    assert [c.name for c in spec.checkpoints] == [demo.CHECKPOINT]


def test_the_dataset_archive_is_the_same_every_time() -> None:
    archive = demo.dataset_archive()
    assert archive == demo.dataset_archive()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        train = tar.extractfile("demo-dataset/train.csv")
        assert train is not None
        rows = train.read().decode().splitlines()
    assert names == [f"demo-dataset/{n}" for n in ("train.csv", "valid.csv", "test.csv")]
    assert rows[0] == "x,y" and len(rows) == 201


def test_the_checkpoint_archive_is_the_same_every_time() -> None:
    archive = demo.checkpoint_archive()
    assert archive == demo.checkpoint_archive()
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        assert z.namelist() == ["start.json"]
        assert json.loads(z.read("start.json"))["name"] == demo.CHECKPOINT


@pytest.mark.parametrize("checkpoint", [True, False])
def test_train_py_fits_the_archive_in_its_input(tmp_path: Path, checkpoint: bool) -> None:
    """As a worker runs it: the archive in ML_DATA_PATH, the checkpoint (if any) unpacked in
    ML_CHECKPOINT_PATH, the model in ML_OUTPUT_PATH."""
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / demo.DATASET).write_bytes(demo.dataset_archive())
    (tmp_path / "train.py").write_text(demo.MODEL_FILES["train.py"])
    (tmp_path / "checkpoint").mkdir()
    if checkpoint:
        with zipfile.ZipFile(io.BytesIO(demo.checkpoint_archive())) as z:
            z.extractall(tmp_path / "checkpoint")
    done = subprocess.run(
        [sys.executable, str(tmp_path / "train.py")],
        env={
            "ML_DATA_PATH": str(tmp_path / "input"),
            "ML_OUTPUT_PATH": str(tmp_path / "out"),
            "ML_CHECKPOINT_PATH": str(tmp_path / "checkpoint"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said = f"checkpoint {demo.CHECKPOINT}: from y = 1.0 * x + 0.0"
    assert (said in done.stdout) is checkpoint
    model = json.loads((tmp_path / "out" / "model.json").read_text())
    assert model["a"] == pytest.approx(3, abs=0.1) and model["b"] == pytest.approx(2, abs=0.3)
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["test_mae"] < 0.6
    assert "mean absolute error on 50 rows" in done.stdout


def test_the_storage_ports_follow_the_base_port() -> None:
    ports = StoragePorts(5060)
    assert ports.named == {
        "s3": 5060,
        "gcs": 5061,
        "azure": 5062,
        "git": 5063,
        "git-http": 5064,
        "web": 5065,
        "ftp": 5066,
    }
    assert ports.passive == (5070, 5079)
    assert len(set(ports.all())) == 17


def test_the_readme_shows_the_demo_job_as_just_up_data_writes_it() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    block = readme.split("<!-- demo-job -->\n```yaml\n", 1)[1].split("```", 1)[0]
    written = demo.job_yaml(
        "http://127.0.0.1:5060",
        "http://127.0.0.1:5064/demo-model.git",
        "https://127.0.0.1:5062/devstoreaccount1",
    )
    assert yaml.safe_load(block) == yaml.safe_load(written)


def test_the_readme_shows_the_demo_endpoint_as_just_up_data_writes_it() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    block = readme.split("<!-- demo-endpoint -->\n```yaml\n", 1)[1].split("```", 1)[0]
    written = demo.endpoint_yaml("http://127.0.0.1:5064/demo-model.git")
    assert yaml.safe_load(block) == yaml.safe_load(written)
    spec = JobSpec.model_validate(yaml.safe_load(written))
    assert spec.endpoint is not None
    assert [r.path for r in spec.endpoint.routes] == ["/sum", "/line"]


def test_the_demo_routes_answer_as_the_readme_says() -> None:
    app: dict[str, Any] = {}
    exec(compile(demo.APP_PY, "app.py", "exec"), app)  # the file the repository serves
    assert app["add"](a=1, b=2) == {"sum": 3}
    assert app["line"](2.0, 3.0, 2.0) == {"y": 8.0}
