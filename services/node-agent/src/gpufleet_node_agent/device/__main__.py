"""`python -m gpufleet_node_agent.device`: enrol with the device's join token if need be,
then run its configuration."""

from __future__ import annotations

import functools

from gpufleet_auth import connect_options
from gpufleet_bus import BusSettings, run_service

from ..enrol import EnrolmentError, enrol
from .app import SERVICE, build_device_app
from .settings import DeviceSettings


async def credential(settings: DeviceSettings, bus: BusSettings) -> BusSettings:
    path = bus.nats_creds or settings.device_state_dir / "device.creds"
    if not path.exists():
        if not settings.join_token:
            raise EnrolmentError(
                f"no credential at {path} and no join token: get one with "
                "`gpufleet device token <device>` and set GPUFLEET_JOIN_TOKEN"
            )
        tls = connect_options(None, bus.nats_ca)
        await enrol(bus.servers, settings.join_token, settings.minion_id, path, tls=tls)
    return bus.model_copy(update={"nats_creds": path})


def main() -> None:
    settings = DeviceSettings()  # GPUFLEET_MINION_ID and the rest from the environment
    run_service(
        SERVICE,
        functools.partial(build_device_app, settings=settings),
        uses_store=False,
        credential=functools.partial(credential, settings),
        dead_letters_as=f"node-{settings.minion_id}",
        exit_check_s=1.0,
    )


if __name__ == "__main__":
    main()
