"""A requirements.txt at the top of a job's model code (R-JOB-7): the image step, which runs
after the inputs step staged the code, reads it and builds it into the job's packages image
in the requirements.txt place (apt, conda, that file, the spec's lines, pip); a line the
spec's `packages.requirements` could not hold, or a file that is not a plain small UTF-8
file, fails the worker before anything is built."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts import limits
from gpufleet_contracts.jobs import Mount, MountKind
from gpufleet_contracts.jobspec import Packages
from gpufleet_contracts.locations import GitSource
from gpufleet_node_agent.builds import BuildConfig
from gpufleet_node_agent.packages import Step, build_key
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.steps import image as image_step
from gpufleet_node_agent.steps.base import StepName, WorkerFailed
from gpufleet_node_agent.steps.image import REQUIREMENTS_BYTES, ImageStep, staged_requirements
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

pytestmark = pytest.mark.unit

MODELS = "/opt/ml/models"
BASE = "localhost/gpufleet/base:test"


def worker(tmp_path: Path, *, model: bool = True, **packages: list[str]) -> Worker:
    mounts = (
        (
            Mount(
                target=MODELS,
                kind=MountKind.model,
                source=GitSource(url="https://git.example/m.git"),
                env="ML_MODEL_PATH",
            ),
        )
        if model
        else ()
    )
    spec = WorkerSpec(
        placement_id="p",
        job_id="j",
        worker=0,
        command=("true",),
        mounts=mounts,
        packages=Packages(**packages),
        owner="acct",
    )
    return Worker(spec, tmp_path)


def staged(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "mnt/opt/ml/models/requirements.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        path.write_text(text)
    else:
        path.write_bytes(text)
    return path


def test_the_image_step_runs_after_the_inputs_step_and_the_disk_before_them() -> None:
    runtime = PodmanRuntime(PodmanConfig(image="localhost/none"), "m1")
    names = [s.name for s in runtime.steps]
    assert names.index(StepName.disk) < names.index(StepName.inputs) < names.index(StepName.image)
    assert names[0] == StepName.keys and names[-2:] == [StepName.outputs, StepName.serve]


def test_the_staged_file_is_read_and_checked(tmp_path: Path) -> None:
    assert staged_requirements(worker(tmp_path, model=False)) is None
    w = worker(tmp_path)
    assert staged_requirements(w) is None  # model code without the file
    staged(tmp_path, "# the model's\nnumpy>=1.26\n\nscipy==1.13  # pinned\n")
    found = staged_requirements(w)
    assert found is not None and found.path == "/opt/ml/models/requirements.txt"
    assert found.lines == ("# the model's", "numpy>=1.26", "", "scipy==1.13  # pinned")
    # a file deeper in the code is not the code's requirements.txt
    (tmp_path / "mnt/opt/ml/models/requirements.txt").unlink()
    (tmp_path / "mnt/opt/ml/models/sub").mkdir()
    (tmp_path / "mnt/opt/ml/models/sub/requirements.txt").write_text("-e .\n")
    assert staged_requirements(w) is None


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("-e .", "line 2: '-e .'"),
        ("--index-url http://elsewhere/simple", "line 2: '--index-url"),
        ("pkg @ https://x/p.whl", "line 2: 'pkg @ https://x/p.whl'"),
        ("./local/pkg", "line 2: './local/pkg'"),
        ("-r other.txt", "line 2: '-r other.txt'"),
    ],
)
def test_a_bad_line_fails_the_worker_naming_it(tmp_path: Path, line: str, says: str) -> None:
    staged(tmp_path, f"numpy\n{line}\nscipy\n")
    with pytest.raises(WorkerFailed) as exc:
        staged_requirements(worker(tmp_path))
    assert exc.value.reason.startswith(f"/opt/ml/models/requirements.txt {says}")


def test_what_is_not_a_plain_small_utf8_file_fails_the_worker(tmp_path: Path) -> None:
    w = worker(tmp_path)
    secret = tmp_path / "host-secret"
    secret.write_text("numpy\n")
    path = staged(tmp_path, "x")
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(WorkerFailed, match="a symlink, not followed"):
        staged_requirements(w)
    path.unlink()
    path.mkdir()
    with pytest.raises(WorkerFailed, match="not a regular file"):
        staged_requirements(w)
    path.rmdir()
    staged(tmp_path, b"numpy\n\xff\xfe\n")
    with pytest.raises(WorkerFailed, match="not UTF-8 text"):
        staged_requirements(w)
    staged(tmp_path, "# " + "x" * REQUIREMENTS_BYTES + "\n")
    with pytest.raises(WorkerFailed, match=f"larger than {REQUIREMENTS_BYTES} bytes"):
        staged_requirements(w)
    many = "".join(f"p{i}\n" for i in range(limits.PACKAGES + 1))
    staged(tmp_path, many)
    with pytest.raises(WorkerFailed, match=f"line {limits.PACKAGES + 1}: .*more than"):
        staged_requirements(w)
    staged(tmp_path, "# comment\n" * 300 + "numpy\n")  # comments are no requirement
    assert staged_requirements(w) is not None


class FakeBuilder:
    """What the image step asks builds.py for: the images it would build and their steps."""

    def __init__(self) -> None:
        self.config = BuildConfig()
        self.built: list[tuple[str, str, tuple[Step, ...]]] = []

    async def exists(self, image: str) -> bool:
        return True

    async def ensure(
        self, tag: str, from_image: str, steps: tuple[Step, ...], say: Callable[[str], None]
    ) -> str | None:
        self.built.append((tag, from_image, steps))
        return None


async def fake_podman(*args: str) -> tuple[int, bytes, bytes]:
    if "--format" in args and "{{.Id}}" in args:
        return 0, f"sha256:{args[-1]}".encode(), b""
    return 0, b"1000", b""  # the image's size


async def prepared(
    w: Worker, monkeypatch: pytest.MonkeyPatch, builder: FakeBuilder | None = None
) -> tuple[FakeBuilder, str | None]:
    async def base_is_here(*args: Any) -> str | None:
        return None

    monkeypatch.setattr(image_step, "ensure_image", base_is_here)
    builder = builder or FakeBuilder()
    step = ImageStep(fake_podman, builder, PodmanConfig(image=BASE), {})  # type: ignore[arg-type]
    await step.setup(w)
    return builder, step.image(w)


async def test_the_model_code_file_is_built_in_the_requirements_txt_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged(tmp_path, "numpy>=1.26\n")
    w = worker(tmp_path, apt=["hello"], requirements=["scipy==1.13"], pip=["b==2"])
    builder, made = await prepared(w, monkeypatch)
    tag, _, steps = builder.built[-1]
    assert [s.name for s in steps] == [
        "apt",
        "requirements.txt (/opt/ml/models/requirements.txt)",
        "requirements.txt",
        "pip",
    ]
    assert steps[1].items == ("numpy>=1.26",) and steps[2].items == ("scipy==1.13",)
    assert made == tag

    # the same requirements again: the same image (builds.py finds it by this tag)
    again, _ = await prepared(
        worker(tmp_path, apt=["hello"], requirements=["scipy==1.13"], pip=["b==2"]), monkeypatch
    )
    assert again.built[-1][0] == tag
    # another file, another image
    staged(tmp_path, "numpy>=2\n")
    other, _ = await prepared(
        worker(tmp_path, apt=["hello"], requirements=["scipy==1.13"], pip=["b==2"]), monkeypatch
    )
    assert other.built[-1][0] != tag


async def test_model_code_with_a_requirements_txt_alone_gets_a_packages_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No packages in the spec: the file alone makes the worker's image (on a pip-ready
    environment, as a spec's requirements lines would)."""
    w = worker(tmp_path)
    builder, made = await prepared(w, monkeypatch)
    assert builder.built == [] and made is None  # no file: the base image as it is
    staged(tmp_path, "numpy\n")
    builder, made = await prepared(w, monkeypatch)
    (env_tag, _, env_steps), (tag, from_image, steps) = builder.built
    assert env_steps == (Step("apt", ("python3-pip",)),) and from_image == env_tag
    assert steps == (Step("requirements", ("numpy",), origin="/opt/ml/models/requirements.txt"),)
    assert tag == made and tag.endswith(build_key(f"sha256:{env_tag}", steps, None, "acct")[:24])


async def test_a_bad_line_fails_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged(tmp_path, "numpy\n--extra-index-url https://evil.example/simple\n")
    builder = FakeBuilder()
    with pytest.raises(WorkerFailed, match=r"requirements\.txt line 2: '--extra-index-url"):
        await prepared(worker(tmp_path, pip=["b==2"]), monkeypatch, builder)
    assert builder.built == []
