import asyncio

from gpufleet_bus import BusSettings, make_broker

from .app import SERVICE, build_app, dead_letter_service
from .settings import AgentSettings


def main() -> None:
    settings = AgentSettings()
    bus = BusSettings()
    broker = make_broker(SERVICE, bus, dead_letters_as=dead_letter_service(settings.minion_id))
    app, _ = build_app(settings, broker, bus=bus)
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
