"""What `just up` prints once the stack is up: who the CLI is, and what to try in another
terminal, each line as it can be typed."""

from __future__ import annotations

from gpufleet_cli.console import DEFAULT_URL as DEFAULT_CONSOLE_URL
from gpufleet_node_agent.baseimage import BASE_IMAGE

from gpufleet_devstack import identities
from gpufleet_devstack.cli_context import Saved
from gpufleet_devstack.console import rel
from gpufleet_devstack.stack import Stack
from gpufleet_devstack.storage import demo
from gpufleet_devstack.storage.servers import StorageServers

CLI = "uv run gpufleet"


def print_what_to_try(stack: Stack, context: Saved | None) -> None:
    out = stack.out
    creds = rel(identities.user_creds(stack.nats))
    out.plain("")
    if context is None:
        out.plain(f"The CLI: {CLI} login --creds {creds} --url {stack.nats.url} --context local")
    elif context.current:
        out.plain(
            f"The CLI's context `{context.name}` is current: user dev of account local at "
            f"{stack.nats.url}"
        )
    else:
        out.plain(
            f"The CLI's context `{context.name}` talks to this stack; yours, "
            f"`{context.other}`, stays current: {CLI} context use {context.name}"
        )
    login = f"{CLI} console login"
    if stack.console_url != DEFAULT_CONSOLE_URL:
        login = f"GPUFLEET_CONSOLE_URL={stack.console_url} {login}"
    out.plain(f"The web console: {stack.console_url} (sign in with the link `{login}` prints)")
    out.plain("")
    out.plain("What to try (in another terminal, in this directory):")
    lines = [
        f"{CLI} node list",
        f'id=$({CLI} job submit --name hello --gpu-type "RTX 3090" --gpu-count 1 '
        "-- python -c \"print('hi')\")",
        f"{CLI} job logs --follow $id",
        f"{CLI} job show $id",
        f"{CLI} billing balance",
    ]
    if stack.gcp is not None:
        lines += [
            f"{CLI} region list   # the emulated GCP region and its runnable jobs",
            f"{CLI} job submit --name cloud --gpu-type V100 --gpu-count 1 "
            "--max-price 1.0 --allow-burst -- python -c \"print('from the cloud')\"",
        ]
    if stack.registry is not None:
        address = stack.registry.address
        lines += [
            f"# a customer image: the local registry {address} (plain HTTP, kept across restarts)",
            "uv run python -m gpufleet_node_agent.baseimage "
            f"&& podman tag localhost/{BASE_IMAGE} {address}/me/app:1 "
            f"&& podman push --tls-verify=false {address}/me/app:1",
        ]
    if stack.storage is not None:
        lines += storage_lines(stack.storage)
    for line in lines:
        out.plain(f"  {line}")
    out.plain("")
    if stack.storage is not None:
        out.plain(f"The demo job ({rel(stack.storage.job_file)}):")
        for line in stack.storage.job_file.read_text().splitlines():
            out.plain(f"  {line}")
        out.plain("")


def storage_lines(storage: StorageServers) -> list[str]:
    """`--data`: each storage server's endpoint and credentials, and the demo to try."""
    s3, azure, ftp = storage.s3.endpoint, storage.azure.endpoint, storage.ftp.endpoint
    ca = rel(storage.tls.ca)
    return [
        f"# the storage servers (--data); https ones trust the CA {ca}",
        f"#   S3 (moto)      {s3.url}  access key {s3.access_key_id}, secret "
        f"{s3.secret_access_key}, buckets s3://{demo.BUCKET}",
        f"#   GCS            {storage.gcs.endpoint.url}  (STORAGE_EMULATOR_HOST; no "
        f"credentials), gs://{demo.BUCKET}",
        f"#   Azure Blob     {azure.account_url}  account {azure.account_name}, key in "
        f"{rel(storage.keys_dir / 'azure.json')}, container {demo.BUCKET}",
        f"#   git            {storage.git.url(demo.MODEL_REPO)}  "
        f"{storage.git_http.url(demo.MODEL_REPO)}",
        f"#   files          {storage.web.url(demo.DATASET)}  {ftp.url(demo.DATASET)} "
        f"(anonymous; {ftp.user}/{ftp.password} may write)",
        f"{CLI} key add wasabi --from-file {rel(storage.keys_dir / 'wasabi.json')}",
        f"{CLI} key add azure --from-file {rel(storage.keys_dir / 'azure.json')}",
        f"{CLI} job submit -f {rel(storage.job_file)}",
        f"{CLI} job submit -f {rel(storage.endpoint_file)}   # the demo endpoint (README)",
        f"curl --cacert {ca} -O {storage.web.url(demo.DATASET)}",
        f"git clone {storage.git_http.url(demo.MODEL_REPO)}",
    ]
