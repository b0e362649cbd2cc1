import asyncio

from gpufleet_bus import BusSettings, make_broker

from .app import SERVICE, build_app
from .settings import AgentSettings


def main() -> None:
    settings = AgentSettings()
    bus = BusSettings()
    app, _ = build_app(settings, make_broker(SERVICE, bus), bus=bus)
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
