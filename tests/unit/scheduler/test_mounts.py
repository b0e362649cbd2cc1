"""Mount plans (R-JOB-3/4): where each worker finds its data, model, checkpoints, output."""

from decimal import Decimal
from pathlib import Path
from typing import Any

from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.locations import S3Source
from gpufleet_node_agent.runtimes.supervise import mount_dirs, worker_env
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_scheduler.mounts import archive_name, plan

BASE: dict[str, Any] = {"name": "my job", "gpu_types": ["RTX 3090"], "command": ["true"]}


def targets(spec: dict[str, Any], worker: int = 0) -> dict[str, str | None]:
    p = plan(JobSpec.model_validate({**BASE, **spec}), worker)
    return {m.target: m.env for m in p.mounts}


def test_one_dataset_mounts_at_input_several_at_their_names() -> None:
    assert targets({"datasets": [{"name": "PASCAL VOC"}]})["/opt/ml/input"] == "ML_DATA_PATH"
    t = targets({"datasets": [{"name": "PASCAL VOC"}, {"name": "coco"}]})
    assert t["/opt/ml/input/PASCAL_VOC"] == "ML_DATA_PATH_PASCAL_VOC"
    assert t["/opt/ml/input/coco"] == "ML_DATA_PATH_COCO"


def test_checkpoints_model_and_output() -> None:
    t = targets(
        {
            "checkpoints": [{"name": "My Checkpoint"}, {"name": "base"}],
            "model": {"source": "git", "path": "https://github.com/me/m.git"},
        }
    )
    assert "/opt/ml/checkpoint/My_Checkpoint" in t and "/opt/ml/checkpoint/base" in t
    assert t["/opt/ml/models"] == "ML_MODEL_PATH"
    assert t["/opt/ml/output"] == "ML_OUTPUT_PATH"
    assert targets({"checkpoints": [{"name": "one"}]})["/opt/ml/checkpoint"] == (
        "ML_CHECKPOINT_PATH"
    )


def test_output_archive_names() -> None:
    assert archive_name("my job", 0, 1) == "my_job.zip"
    assert archive_name("train", 2, 4) == "train_2.zip"
    spec = JobSpec.model_validate(
        {**BASE, "workers": 2, "output_data": {"type": "aws", "path": "s3://b/out"}}
    )
    p = plan(spec, 1)
    assert p.output_archive == "my_job_1.zip" and p.output == S3Source(url="s3://b/out")


def test_the_agent_creates_the_mount_dirs_and_exposes_them(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        {**BASE, "datasets": [{"name": "a"}, {"name": "b"}], "gpu_count": "0.5"}
    )
    p = plan(spec, 0)
    worker_spec = WorkerSpec(
        placement_id="p",
        job_id="j",
        worker=0,
        gpu_indices=(1,),
        mounts=p.mounts,
        output_archive=p.output_archive,
        gpu_fraction=Decimal("0.5"),
        gpu_memory_limit_mb=12288,
    )
    dirs = mount_dirs(worker_spec, tmp_path)
    assert dirs["ML_DATA_PATH_A"] == tmp_path / "mnt/opt/ml/input/a"
    env = worker_env(worker_spec, tmp_path, {})
    assert env["ML_DATA_PATH"] == str(tmp_path / "mnt/opt/ml/input")
    assert env["ML_OUTPUT_PATH"] == str(tmp_path / "output")
    assert env["GPU_FRACTION"] == "0.5" and env["GPU_MEMORY_LIMIT_MB"] == "12288"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288M"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
