"""The image a container worker runs in (R-JOB-7), made ready before its container starts:

1. its customer image, pulled with its credential (images.py); or else its base
   environment (environments.py): the base image, an operator's image, or one built once
   per node (builds.py);
2. its packages (packages.py), installed into that image by a build with the network, in
   the order apt, conda, requirements.txt (a requirements.txt of its model code, then the
   spec's lines), pip, the result cached under a tag keyed by the image's ID, the packages,
   the index and the job's owner; the job then runs offline;
3. the image it will run checked against its `disk_size_gb`.

Progress goes into the worker's `log` (shipped as its log, so `gpufleet logs` shows it while
the job is `starting`), as lines beginning `gpufleet: `.
"""

from __future__ import annotations

from .builds import Builder, Podman
from .environments import EnvChoice, choose, with_jupyter, with_pip
from .images import pull_image, qualified, size_error
from .packages import ModelRequirements, Step, build_key, package_tag, plan
from .runtimes.podman_args import PodmanConfig
from .steps.serve import is_notebook
from .worker.spec import WorkerSpec
from .worker.workdir import Worker

DEFAULT_DISK_GB = 10


def say(w: Worker, line: str) -> None:
    with w.file("log").open("a") as f:
        f.write(f"gpufleet: {line}\n")


def env_choice(spec: WorkerSpec, config: PodmanConfig) -> EnvChoice:
    """Its base environment; a notebook's with JupyterLab."""
    env = spec.base_environment
    wanted = None if env is None else env.model_dump(mode="json")
    choice = choose(wanted, config.image, config.base_environments)
    return with_jupyter(choice, config.image) if is_notebook(spec.serving) else choice


def package_steps(spec: WorkerSpec, model: ModelRequirements | None = None) -> tuple[Step, ...]:
    """Its packages' steps; `model`: the requirements.txt found in its model code."""
    if spec.packages.empty() and model is None:
        return ()
    return plan(spec.packages.model_dump(mode="json"), model)


def needs_preparing(
    spec: WorkerSpec, config: PodmanConfig, model: ModelRequirements | None = None
) -> bool:
    """Anything to do before the container runs beyond the base image (made sure of once)?"""
    if spec.image or package_steps(spec, model):
        return True
    choice = env_choice(spec, config)
    return choice.refused is not None or choice.image != config.image


async def _environment(
    podman: Podman, builder: Builder, w: Worker, config: PodmanConfig, steps: tuple[Step, ...]
) -> tuple[str, str | None]:
    """The image the packages (`steps`) go into (the customer's or the base environment's)."""
    spec = w.spec
    disk = spec.disk_size_gb or DEFAULT_DISK_GB
    image = spec.image
    if image:
        say(w, f"pulling image {image}")
        error = await pull_image(podman, w.dir, image, disk, config.insecure_registries)
        return qualified(image), error
    choice = env_choice(spec, config)
    if choice.refused is not None:
        return "", choice.refused
    if any(s.kind in ("requirements", "pip") for s in steps):
        choice = with_pip(choice, config.image)
    if choice.mapped and not await builder.exists(choice.image):
        say(w, f"pulling base environment {choice.image}")
        return choice.image, await pull_image(
            podman, w.dir, choice.image, disk, config.insecure_registries
        )
    for built in (choice.first, choice):
        if built is None or not built.steps:
            continue
        error = await builder.ensure(
            built.image, built.from_image, built.steps, lambda line: say(w, line)
        )
        if error is not None:
            return "", f"cannot build base environment {built.image}: {error}"
    return choice.image, None


async def prepare_image(
    podman: Podman,
    builder: Builder,
    w: Worker,
    config: PodmanConfig,
    model: ModelRequirements | None = None,
) -> tuple[str, str | None]:
    """(the image the worker runs in, None), or (_, why it cannot run); `model`: the
    requirements.txt found in its model code."""
    spec = w.spec
    steps = package_steps(spec, model)
    image, error = await _environment(podman, builder, w, config, steps)
    if error is not None:
        return image, error
    if steps:
        rc, out, err = await podman("image", "inspect", "--format", "{{.Id}}", image)
        if rc != 0:
            return image, f"cannot read image {image}: {err.decode(errors='replace')[-300:]}"
        key = build_key(out.decode().strip(), steps, builder.config.index_url, spec.owner or "")
        tag = package_tag(key)
        say(w, "packages: " + ", then ".join(f"{s.name} ({len(s.items)})" for s in steps))
        error = await builder.ensure(tag, image, steps, lambda line: say(w, line))
        if error is not None:
            return image, error
        image = tag
    if steps or not spec.image:  # a pulled image was checked by the pull
        error = await size_error(podman, image, spec.disk_size_gb or DEFAULT_DISK_GB)
    return image, error
