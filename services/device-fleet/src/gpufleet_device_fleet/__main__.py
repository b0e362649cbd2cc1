import asyncio

from gpufleet_bus import make_broker
from gpufleet_store import Store

from .app import SERVICE, build_app


def main() -> None:
    asyncio.run(build_app(Store.connect(SERVICE), make_broker(SERVICE)).run())


if __name__ == "__main__":
    main()
