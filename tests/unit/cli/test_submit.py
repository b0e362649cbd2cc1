"""`gpufleet job submit`: local validation, file + flags, what goes on the wire (no NATS)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.jobs import generated_name
from gpufleet_cli.main import app
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from typer.testing import CliRunner

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})


@pytest.fixture
def no_bus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything would be sent."""

    def send(*args: Any, **kwargs: Any) -> bytes:
        pytest.fail(f"nothing should be sent, got {args}")

    monkeypatch.setattr(client, "send", send)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Capture requests; the scheduler accepts every job as j1."""
    calls: list[dict[str, Any]] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        calls.append(
            {"subject": subject, "payload": json.loads(payload), "headers": headers, "retry": retry}
        )
        return json.dumps({"id": "j1", "state": "queued", "queue_reason": "none free"}).encode()

    monkeypatch.setattr(client, "send", send)
    return calls


BAD = ["--disk-size", "5", "--gpu-type", "RTX 9999", "--max-price", "-1"]
BASE = ["job", "submit", "--name", "train-1"]


def test_invalid_flags_are_refused_locally_as_json(no_bus: None) -> None:
    result = runner.invoke(app, [*BASE, *BAD, "--json", "--", "python", "train.py"])
    assert result.exit_code == 2
    reply = json.loads(result.stdout)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "invalid"
    fields = {f["field"]: f for f in reply["error"]["fields"]}
    assert set(fields) == {"disk_size_gb", "gpu_types", "max_price"}
    assert all(f["rule"] == "R-JOB-2" for f in fields.values())
    assert "RTX 3090" in fields["gpu_types"]["valid"]  # says what would be valid
    assert "10..1000" in fields["disk_size_gb"]["valid"]


def test_invalid_flags_readable_table_on_stderr(no_bus: None) -> None:
    result = runner.invoke(app, [*BASE, *BAD, "--", "python", "train.py"])
    assert result.exit_code == 2
    assert result.stdout == ""
    for text in (
        "Field",
        "Rule",
        "Problem",
        "Valid",
        "disk_size_gb (--disk-size)",
        "R-JOB-2",
        "RTX 9999",
        "max_price",
    ):
        assert text in result.stderr


def test_bad_env_pair_and_missing_command(no_bus: None) -> None:
    result = runner.invoke(app, [*BASE, "--gpu-type", "RTX 3090", "-e", "NOEQUALS", "--json"])
    assert result.exit_code == 2
    fields = {f["field"]: f["rule"] for f in json.loads(result.stdout)["error"]["fields"]}
    assert fields == {"command": "R-JOB-5", "env": "R-JOB-7"}


def test_flags_build_the_submit_payload_and_headers(sent: list[dict[str, Any]]) -> None:
    result = runner.invoke(
        app,
        [
            *BASE,
            "-g",
            "RTX 3090",
            "-g",
            "T4",
            "--gpu-count",
            "2",
            "--max-price",
            "0.5",
            "--workers",
            "3",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--",
            "python",
            "train.py",
            "--epochs",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "j1\n"
    assert "waiting for GPUs: none free" in result.stderr
    (call,) = sent
    # the acting account is the subject's last token, never a header (R-TEN-2)
    assert call["subject"] == f"{SubmitJob.SUBJECT}.acme"
    spec = call["payload"]["spec"]
    assert spec["command"] == ["python", "train.py", "--epochs", "3"]
    assert spec["gpu_types"] == ["RTX 3090", "T4"]
    assert spec["max_price"] == "0.5"  # money stays a decimal string
    assert (spec["gpu_count"], spec["workers"]) == (2, 3)
    assert spec["env"] == {"A": "1", "B": "x=y"}
    headers = call["headers"]
    assert "gpufleet-account" not in headers
    assert headers["ce-type"] == SubmitJob.TYPE
    assert headers["ce-source"] == "gpufleet/cli"
    assert headers["ce-subject"] == SubmitJob.SUBJECT
    assert headers["ce-specversion"] == "1.0"


def test_yaml_file_with_flag_override(tmp_path: Path, sent: list[dict[str, Any]]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: from-file\n"
        "gpu_types: [RTX 3090]\n"
        "gpu_count: 1\n"
        "disk_size_gb: 50\n"
        "command: [python, train.py]\n"
        "env: {A: file, B: file}\n"
    )
    result = runner.invoke(
        app,
        [
            "job",
            "submit",
            "-f",
            str(job),
            "--gpu-count",
            "4",
            "--name",
            "override",
            "-e",
            "B=flag",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"id": "j1", "state": "queued", "queue_reason": "none free"}
    (call,) = sent
    assert call["subject"] == f"{SubmitJob.SUBJECT}.acme"
    assert "gpufleet-account" not in call["headers"]
    spec = call["payload"]["spec"]
    assert spec["name"] == "override"
    assert spec["gpu_count"] == 4
    assert spec["disk_size_gb"] == 50
    assert spec["gpu_types"] == ["RTX 3090"]
    assert spec["command"] == ["python", "train.py"]
    assert spec["env"] == {"A": "file", "B": "flag"}


def test_json_file_and_command_override(tmp_path: Path, sent: list[dict[str, Any]]) -> None:
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "spec": {
                    "name": "j",
                    "gpu_types": ["T4"],
                    "command": ["old"],
                    "type": "inference",
                }
            }
        )
    )
    result = runner.invoke(app, ["job", "submit", "-f", str(job), "--", "new", "cmd"])
    assert result.exit_code == 0, result.output
    spec = sent[0]["payload"]["spec"]
    assert spec["command"] == ["new", "cmd"]
    assert spec["type"] == "inference"


def test_unreadable_file_is_invalid_input(tmp_path: Path, no_bus: None) -> None:
    missing = runner.invoke(app, ["job", "submit", "-f", str(tmp_path / "nope.yaml"), "--json"])
    assert missing.exit_code == 2
    assert json.loads(missing.stdout)["error"]["code"] == "invalid"
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    not_mapping = runner.invoke(app, ["job", "submit", "-f", str(tmp_path / "list.yaml")])
    assert not_mapping.exit_code == 2
    assert "mapping" in not_mapping.stderr


def test_server_side_refusal_is_rendered_like_local_one(monkeypatch: pytest.MonkeyPatch) -> None:
    reply = {
        "ok": False,
        "error": {
            "code": "invalid",
            "message": "the request is not valid",
            "fields": [
                {
                    "field": "spec.gpu_count",
                    "rule": "R-JOB-2",
                    "message": "too many",
                    "valid": "0..16",
                }
            ],
        },
    }
    monkeypatch.setattr(client, "send", lambda *a: json.dumps(reply).encode())
    args = [*BASE, "-g", "T4", "--", "x"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "spec.gpu_count (--gpu-count)" in result.stderr
    assert "too many" in result.stderr
    as_json = runner.invoke(app, [*args[:-2], "--json", "--", "x"])
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout) == reply


def test_a_full_spec_file_and_flags_go_through_the_same_validation(
    sent: list[dict[str, Any]], tmp_path: Path
) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(
        "name: train-1\n"
        "gpu_types: [RTX 3090]\n"
        "workers: 2\n"
        "datasets: [{name: PASCAL VOC}, {name: coco}]\n"
        "checkpoints: [{name: base}]\n"
        "model: {source: git, path: 'https://github.com/me/m.git'}\n"
        "output_data: {type: aws, path: 's3://bucket/out'}\n"
        "environment: {python_version: '3.11', framework: pytorch, packages: {pip: [wandb]}}\n"
        "worker_commands: [[python, a.py], [python, b.py]]\n"
    )
    result = runner.invoke(app, ["job", "submit", "-f", str(f), "--region", "eu", "--json"])
    assert result.exit_code == 0, result.output
    spec = sent[0]["payload"]["spec"]
    assert spec["region"] == "eu" and spec["workers"] == 2
    assert [d["name"] for d in spec["datasets"]] == ["PASCAL VOC", "coco"]


def test_spec_errors_from_a_file_name_nested_fields(no_bus: None, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(
        "name: ep\ntype: endpoint\ngpu_types: [RTX 3090]\n"
        "endpoint: {routes: [{verb: GET, path: /p, file: ../x.py, function: f}]}\n"
    )
    result = runner.invoke(app, ["job", "submit", "-f", str(f), "--json"])
    assert result.exit_code == 2
    fields = {e["field"]: e["rule"] for e in json.loads(result.stdout)["error"]["fields"]}
    assert fields["endpoint.routes.0.verb"] == "R-JOB-6"
    assert fields["endpoint.routes.0.file"] == "R-JOB-6"


def test_fraction_and_data_flags(sent: list[dict[str, Any]]) -> None:
    result = runner.invoke(
        app,
        [
            *BASE,
            "--gpu-type",
            "RTX 3090",
            "--gpu-count",
            "0.5",
            "--dataset",
            "coco",
            "--model",
            "git:https://github.com/me/m.git",
            "--output",
            "platform:model",
            "--json",
            "--",
            "python",
            "t.py",
        ],
    )
    assert result.exit_code == 0, result.output
    spec = sent[0]["payload"]["spec"]
    assert spec["gpu_fraction"] == "0.5" and spec["gpu_count"] == 1
    assert spec["model"] == {
        "source": "git",
        "path": "https://github.com/me/m.git",
        "endpoint": None,
    }
    assert spec["output_data"]["type"] == "platform"


def test_an_integer_flag_that_is_not_a_number_is_refused_by_field(no_bus: None) -> None:
    """(Numbers go as JSON numbers: test_flags_build_the_submit_payload_and_headers.)"""
    result = runner.invoke(app, [*BASE, "-g", "T4", "--workers", "two", "--json", "--", "x"])
    assert result.exit_code == 2
    fields = {f["field"]: f["rule"] for f in json.loads(result.stdout)["error"]["fields"]}
    assert fields == {"workers": "R-JOB-5"}


def test_a_boolean_count_in_a_file_is_refused(no_bus: None, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("name: j\ngpu_types: [T4]\ngpu_count: true\ncommand: [x]\n")
    result = runner.invoke(app, ["job", "submit", "-f", str(f), "--json"])
    assert result.exit_code == 2
    (field,) = json.loads(result.stdout)["error"]["fields"]
    assert (field["field"], field["rule"]) == ("gpu_count", "R-JOB-2")


def test_a_spec_over_its_size_cap_is_refused_locally_naming_spec(
    no_bus: None, tmp_path: Path
) -> None:
    f = tmp_path / "job.json"
    spec = {"name": "j", "gpu_types": ["T4"], "command": ["a" * 4000] * 20}
    f.write_text(json.dumps(spec))
    result = runner.invoke(app, ["job", "submit", "-f", str(f), "--json"])
    assert result.exit_code == 2
    (field,) = json.loads(result.stdout)["error"]["fields"]
    assert (field["field"], field["rule"]) == ("spec", "limit:spec_bytes")


def test_image_key_and_pip_flags_go_into_the_files_environment(
    tmp_path: Path, sent: list[dict[str, Any]]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: env\ngpu_types: [RTX 3090]\ngpu_count: 1\ncommand: [python, train.py]\n"
        "environment: {python_version: '3.11', packages: {apt: [curl]}}\n"
    )
    args = ["job", "submit", "-f", str(job), "--image", "registry.local:5000/team/train:1"]
    args += ["--key", "docker", "--pip", "numpy==2.1", "--pip", "tqdm", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (call,) = sent
    environment = call["payload"]["spec"]["environment"]
    assert environment["image"] == "registry.local:5000/team/train:1"
    assert environment["keys"] == ["docker"]
    assert environment["packages"]["pip"] == ["numpy==2.1", "tqdm"]
    assert environment["packages"]["apt"] == ["curl"]  # the file's, kept


def test_a_bad_image_is_refused_naming_its_flag(no_bus: None) -> None:
    args = ["job", "submit", "--name", "x", "--gpu-type", "RTX 3090", "--gpu-count", "1"]
    result = runner.invoke(app, [*args, "--image", "Not An Image!", "--json", "--", "true"])
    assert result.exit_code != 0
    fields = json.loads(result.stdout)["error"]["fields"]
    assert [f["field"] for f in fields] == ["environment.image"]


def test_a_cpu_only_job_from_flags(sent: list[dict[str, Any]]) -> None:
    """R-JOB-2: no GPU type, --gpu-count 0 and --cpu-count."""
    flags = [*BASE, "--gpu-count", "0", "--cpu-count", "8", "--max-price", "0.02"]
    result = runner.invoke(app, [*flags, "--json", "--", "make", "-j8"])
    assert result.exit_code == 0, result.output
    spec = sent[0]["payload"]["spec"]
    assert (spec["gpu_types"], spec["gpu_count"], spec["cpu_count"]) == ([], 0, 8)


def test_a_cpu_only_job_naming_a_gpu_type_is_refused_locally(no_bus: None) -> None:
    flags = [*BASE, "-g", "T4", "--gpu-count", "0", "--cpu-count", "8", "--json", "--", "x"]
    result = runner.invoke(app, flags)
    assert result.exit_code == 2
    fields = {f["field"]: f["rule"] for f in json.loads(result.stdout)["error"]["fields"]}
    assert fields == {"gpu_types": "R-JOB-2"}


OK = [*BASE, "--gpu-type", "RTX 3090", "--", "true"]


def test_every_submission_carries_a_request_id_and_may_be_asked_again(
    sent: list[dict[str, Any]],
) -> None:
    """A new random id per submission, so the CLI can repeat an unanswered ask (retry)
    without queueing a second job; `--request-id` sets it (a script's own key)."""
    for args in (OK, OK, [*BASE, "--request-id", "nightly-2026-11-23", *OK[len(BASE) :]]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    ids = [c["payload"]["request_id"] for c in sent]
    assert len(ids[0]) == 32 and ids[0] != ids[1]
    assert ids[2] == "nightly-2026-11-23"
    assert all(c["retry"] for c in sent)
    assert SubmitJob.model_validate(sent[0]["payload"]).request_id == ids[0]


def test_a_request_id_that_is_not_valid_is_refused_naming_the_flag(no_bus: None) -> None:
    result = runner.invoke(app, [*BASE, "--request-id", "x" * 129, "--json", *OK[len(BASE) :]])
    assert result.exit_code == 2
    reply = json.loads(result.stdout)
    assert [f["field"] for f in reply["error"]["fields"]] == ["request_id"]


NAMED = re.compile(r"[a-z]+-[a-z]+-[0-9a-f]{4}")


def test_without_a_name_one_is_made_up_and_said_on_stderr(sent: list[dict[str, Any]]) -> None:
    result = runner.invoke(app, ["job", "submit", "--gpu-type", "RTX 3090", "--", "true"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "j1\n"  # the id alone
    name = sent[0]["payload"]["spec"]["name"]
    assert NAMED.fullmatch(name)
    assert f"submitted as {name}; waiting for GPUs: none free" in result.stderr
    pattern = JobSpec.model_json_schema()["properties"]["name"]["pattern"]
    assert all(re.fullmatch(pattern, generated_name()) for _ in range(200))


def test_a_given_name_or_the_files_is_kept(tmp_path: Path, sent: list[dict[str, Any]]) -> None:
    result = runner.invoke(app, OK)
    assert result.exit_code == 0, result.output
    assert "submitted; " in result.stderr and "submitted as" not in result.stderr
    job = tmp_path / "job.yaml"
    job.write_text("name: from-file\ngpu_types: [RTX 3090]\ncommand: [python, train.py]\n")
    result = runner.invoke(app, ["job", "submit", "-f", str(job)])
    assert result.exit_code == 0, result.output
    assert [c["payload"]["spec"]["name"] for c in sent] == ["train-1", "from-file"]


def test_a_cpu_only_job_is_said_to_wait_for_cpus(sent: list[dict[str, Any]]) -> None:
    result = runner.invoke(app, [*BASE, "--gpu-count", "0", "--cpu-count", "4", "--", "true"])
    assert result.exit_code == 0, result.output
    assert "submitted; waiting for CPUs: none free" in result.stderr
