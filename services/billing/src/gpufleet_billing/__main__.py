import asyncio

from gpufleet_bus import make_broker
from gpufleet_store import Store

from .app import SERVICE, build_app


def main() -> None:
    app, _ = build_app(Store.connect(SERVICE), make_broker(SERVICE))
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
