from gpufleet_bus import run_service

from .app import SERVICE, build_app


def main() -> None:
    run_service(SERVICE, build_app)


if __name__ == "__main__":
    main()
