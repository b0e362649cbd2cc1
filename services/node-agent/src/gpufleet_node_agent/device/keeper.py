"""The device's one configuration (R-DEV-3): applied when device-fleet says, run in the
foreground, run again after a reboot or an agent restart, never restarted when it exits by
itself; each step reported on the device's own subject.

What it should run is kept in `desired.json` in the state directory (the configuration, and,
once the command exited by itself, its exit status and the boot it happened in), so a
restarted agent knows whether to start it: after a reboot (another boot id) or when the agent
went down while it ran, yes; when it had exited by itself in this boot, no."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpufleet_bus.broker import VERSION
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.devices import (
    ApplyDeviceConfig,
    DeployState,
    DeviceConfigSpec,
    DeviceStatusReported,
    InferenceStatus,
)
from gpufleet_contracts.health import HealthCheck, NodeHealth
from gpufleet_contracts.images import registry_of

from ..images import write_auth_file
from ..worker.files import write_json_atomic
from . import launch
from .checkpoints import CheckpointsUnavailable, DeviceCheckpoints
from .keys import DeviceKeyFiles, DeviceSecrets, KeysUnavailable
from .output import DeviceOutput, OutputUnavailable
from .settings import DeviceSettings

log = logging.getLogger("gpufleet.node_agent.device")
Report = Callable[[DeviceStatusReported], Awaitable[object]]


@dataclass
class Desired:
    deployment_id: str | None = None
    config_name: str | None = None
    config: DeviceConfigSpec | None = None
    exit_code: int | None = None  # it exited by itself ...
    exit_boot: str | None = None  # ... in this boot

    def doc(self) -> dict[str, Any]:
        return {
            "deployment_id": self.deployment_id,
            "config_name": self.config_name,
            "config": self.config.model_dump(mode="json") if self.config else None,
            "exit_code": self.exit_code,
            "exit_boot": self.exit_boot,
        }

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Desired:
        cfg = doc.get("config")
        return cls(
            doc.get("deployment_id"),
            doc.get("config_name"),
            DeviceConfigSpec.model_validate(cfg) if cfg else None,
            doc.get("exit_code"),
            doc.get("exit_boot"),
        )


def runs_again(d: Desired, boot_id: str) -> bool:
    """Whether a starting agent starts the configuration's command (R-DEV-3): it has one, and
    the command did not exit by itself in this boot (a reboot, or the agent went down while
    it ran)."""
    return d.config is not None and (d.exit_code is None or d.exit_boot != boot_id)


def inference_of(code: int) -> InferenceStatus:
    return InferenceStatus.stopped if code == 0 else InferenceStatus.failed


class DeviceKeeper:
    def __init__(
        self,
        settings: DeviceSettings,
        report: Report,
        clock: Clock,
        output: DeviceOutput,
        keys: DeviceKeyFiles,
        checkpoints: DeviceCheckpoints,
    ) -> None:
        self.settings = settings
        self.output = output
        self.keys = keys
        self.checkpoints = checkpoints
        self.report = report
        self.clock = clock
        self.dir = settings.device_state_dir
        self.file = self.dir / "desired.json"
        self.proc: asyncio.subprocess.Process | None = None
        self.desired = Desired()
        self.lock = asyncio.Lock()
        self.started_at = clock()

    # --- what is kept ----------------------------------------------------------------

    def _load(self) -> Desired:
        try:
            return Desired.of(json.loads(self.file.read_text()))
        except FileNotFoundError:
            return Desired()

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.file, self.desired.doc())

    async def _say(
        self,
        state: DeployState,
        inference: InferenceStatus | None = None,
        reason: str | None = None,
    ) -> None:
        await self.report(
            DeviceStatusReported(
                minion_id=self.settings.minion_id,
                deployment_id=self.desired.deployment_id,
                state=state,
                inference=inference,
                reason=reason,
                at=self.clock(),
            )
        )

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """At start-up: run the configuration again unless it exited by itself in this boot."""
        async with self.lock:
            self.desired = self._load()
            d = self.desired
            if d.config is None:
                await self._say(DeployState.idle)
                return
            if not runs_again(d, self.settings.boot_id()):
                assert d.exit_code is not None
                await self._say(DeployState.running, inference_of(d.exit_code))
                return
            d.exit_code = d.exit_boot = None  # a reboot: it runs again (R-DEV-3)
            self._save()
            await self._launch(d.config)

    async def stop(self) -> None:
        """The agent stopping: its command goes with it (not an exit by itself)."""
        async with self.lock:
            await self._kill()
            self.keys.release()
            await self.checkpoints.release()
            await self.output.release()

    async def apply(self, cmd: ApplyDeviceConfig) -> None:
        """Run this configuration (or none) from now on; the same deployment again (a
        redelivered command) is reported as it is."""
        async with self.lock:
            if cmd.deployment_id == self.desired.deployment_id and self.proc is not None:
                await self._say(DeployState.running, InferenceStatus.running)
                return
            await self._kill()
            self.desired = Desired(cmd.deployment_id, cmd.config_name, cmd.config)
            self._save()
            if cmd.config is None:
                self.keys.release()
                await self.checkpoints.release()
                await self.output.release()
                await self._say(DeployState.idle, InferenceStatus.stopped)
                return
            await self._say(DeployState.pending)
            await self._launch(cmd.config)

    async def watch(self) -> None:
        """A command that exited by itself is kept stopped (R-DEV-3), and said so."""
        async with self.lock:
            proc = self.proc
            if proc is None or proc.returncode is None:
                return
            self.proc = None
            code = proc.returncode
            self.desired.exit_code, self.desired.exit_boot = code, self.settings.boot_id()
            self._save()
            log.info("the inference command exited by itself (%s): not restarted", code)
            await self._say(DeployState.running, inference_of(code), f"exited with status {code}")

    def running(self) -> bool:
        """Whether the configuration's command runs now."""
        return self.proc is not None and self.proc.returncode is None

    async def health(self, body: HealthCheck) -> NodeHealth:
        """This device's health: its profile's one SoC GPU and the deployment it runs."""
        running = self.running()
        return NodeHealth(
            service="device-agent",
            status="ok",
            version=VERSION,
            collections=[],
            minion_id=self.settings.minion_id,
            simulated=self.settings.device_runtime == "simulated",
            gpus=1,
            running=[self.desired.deployment_id or ""] if running else [],
            started_at=self.started_at.isoformat(),
        )

    # --- the command -------------------------------------------------------------------

    async def _launch(self, spec: DeviceConfigSpec) -> None:
        try:
            out = await self.output.take(spec)  # its own directory, or its datastore's path
            secrets = await self.keys.take(spec)  # its attached keys, asked sealed
            if spec.checkpoints:
                await self._say(DeployState.downloading)
            checkpoints = await self.checkpoints.take(spec)  # granted reads, read-only
        except (OutputUnavailable, KeysUnavailable, CheckpointsUnavailable) as exc:
            await self._say(DeployState.failed, InferenceStatus.failed, exc.reason)
            return
        model = self.settings.device_profile.value
        try:
            if self.settings.device_runtime == "podman":
                await self._say(DeployState.downloading)
                await self._pull(spec.image, secrets)
                argv = launch.podman_argv(
                    spec,
                    self.settings.minion_id,
                    out,
                    _video_devices(),
                    model,
                    secrets,
                    checkpoints,
                )
                env = None
            else:
                argv = launch.simulated_argv(spec)
                env = launch.simulated_env(spec, out, dict(os.environ), model, secrets, checkpoints)
            await self._say(DeployState.starting)
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=out,
                env=env,
                start_new_session=True,
                stdin=asyncio.subprocess.DEVNULL,
            )
        except (OSError, RuntimeError) as exc:
            await self._say(DeployState.failed, InferenceStatus.failed, str(exc)[:500])
            return
        await self._settle(self.proc)

    async def _settle(self, proc: asyncio.subprocess.Process) -> None:
        """`running` once the command outlived the start grace; one that failed within it
        failed the deployment (a rollout's canary then stops the rest), and is not run again
        in this boot, as an exit by itself is not."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), self.settings.device_start_grace_s)
        code = proc.returncode
        if code is None:
            await self._say(DeployState.running, InferenceStatus.running)
            return
        self.proc = None
        self.desired.exit_code, self.desired.exit_boot = code, self.settings.boot_id()
        self._save()
        why = f"the start command exited with status {code}"
        if code == 0:
            await self._say(DeployState.running, InferenceStatus.stopped, why)
        else:
            await self._say(DeployState.failed, InferenceStatus.failed, why)

    async def _pull(self, image: str, secrets: DeviceSecrets) -> None:
        """Pull `image`, with its registry key's credential in a 0600 auth file that lives
        for the pull only (images.py, as a worker's pull)."""
        auth = secrets.registry_auth
        authfile = self.dir / "registry-auth.json"
        try:
            write_auth_file(authfile, registry_of(image), auth.model_dump() if auth else None)
            proc = await asyncio.create_subprocess_exec(
                *("podman", "pull", "--quiet", "--authfile", str(authfile), image),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await proc.communicate()
        finally:
            authfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise RuntimeError(f"image pull: {err.decode(errors='replace').strip()[-300:]}")

    async def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def _video_devices() -> list[str]:
    """The SoC's video devices (cameras, the NVDEC/NVENC nodes) to expose to the container."""
    return sorted(glob.glob("/dev/video*"))
