"""The emulator as a child process, for tests and `just up --gcp`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class EmulatorProcess:
    """`python -m gpufleet_gcp_emulator` on free ports; `admin()` drives its fault injection."""

    def __init__(
        self,
        log_file: Path,
        *,
        nats_url: str | None = None,
        agent_dir: Path | None = None,
        delay_s: float = 0.3,
        agent_heartbeat_s: float = 1.0,
        compute_port: int = 0,
        grpc_port: int = 0,
        agent_env: Mapping[str, str] | None = None,
    ) -> None:
        self.log_file = log_file
        # Node agent settings of its instances' image (GPUFLEET_ALLOW_BARE_PROCESSES: agents.py)
        self.agent_env = dict(agent_env or {})
        self.args = [
            sys.executable,
            "-m",
            "gpufleet_gcp_emulator",
            "--delay-s",
            str(delay_s),
            "--agent-heartbeat-s",
            str(agent_heartbeat_s),
            "--compute-port",
            str(compute_port),
            "--pubsub-port",
            str(grpc_port),
        ]
        if nats_url:
            self.args += ["--nats-url", nats_url]
        if agent_dir:
            self.args += ["--agent-dir", str(agent_dir)]
        self.proc: subprocess.Popen[str] | None = None
        self.compute = ""
        self.grpc = ""

    def start(self) -> EmulatorProcess:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_NATS_URL"}
        env.update(self.agent_env)
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=self.log_file.open("a"),
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the GCP emulator did not start; see {self.log_file}")
        ready = json.loads(line)
        self.compute, self.grpc = ready["compute"], ready["grpc"]
        return self

    def env(self) -> dict[str, str]:
        """What the provisioner needs to use this emulator instead of Google."""
        return {
            "GPUFLEET_GCP_COMPUTE_ENDPOINT": self.compute,
            "GPUFLEET_GCP_GRPC_ENDPOINT": self.grpc,
        }

    def admin(self, what: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.compute}/admin/{what}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def service_account_key(
    project: str, key_id: str = "emulated", private_key: str | None = None
) -> dict[str, str]:
    """A service-account key in Google's JSON layout: what an operator pastes to enable the
    gcp provider, for tests and `just up --gcp` against the emulator. The RSA key is a fresh
    one unless `private_key` (PEM) is given, e.g. to reuse one across projects."""
    return {
        "type": "service_account",
        "project_id": project,
        "private_key_id": key_id,
        "private_key": private_key or _new_pem(),
        "client_email": f"gpufleet@{project}.iam.gserviceaccount.com",
    }


def _new_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
