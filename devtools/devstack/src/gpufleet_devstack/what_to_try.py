"""What `just up` prints once the stack is up: the commands to try in another terminal."""

from __future__ import annotations

from gpufleet_devstack import identities
from gpufleet_devstack.console import rel
from gpufleet_devstack.stack import Stack


def print_what_to_try(stack: Stack) -> None:
    out = stack.out
    out.plain("")
    out.plain("What to try (in another terminal):")
    creds = identities.user_creds(stack.nats)
    for line in (
        f"uv run gpufleet login --creds {rel(creds)} --url {stack.nats.url} --context local",
        "   # or, for one shell: export GPUFLEET_NATS_URL="
        f"{stack.nats.url} GPUFLEET_NATS_CREDS={rel(creds)}",
        "uv run gpufleet context show   # user dev of account local (plan team)",
        "uv run gpufleet node list",
        'uv run gpufleet job submit --name hello --gpu-type "RTX 3090" --gpu-count 1 '
        "--max-price 1.0 -- python -c \"print('hi')\"",
        "uv run gpufleet job show <id>",
        "uv run gpufleet billing balance",
        *(
            (
                "uv run gpufleet region list   # the emulated GCP region and its runnable jobs",
                "uv run gpufleet job submit --name cloud --gpu-type V100 --gpu-count 1 "
                "--max-price 1.0 --allow-burst -- python -c \"print('from the cloud')\"",
            )
            if stack.gcp is not None
            else ()
        ),
        *(
            (
                f"# a customer image: the local registry {stack.registry.address} (plain "
                "HTTP), run with GPUFLEET_WORKER_RUNTIME=podman",
                f"podman tag localhost/gpufleet/base:bookworm {stack.registry.address}/me/app:1"
                f" && podman push --tls-verify=false {stack.registry.address}/me/app:1",
            )
            if stack.registry is not None
            else ()
        ),
    ):
        out.plain(f"  {line}")
    out.plain("")
