import sys

from gpufleet_bus import Ports, Service, env_flag, run_service
from gpufleet_store import SecretBox

from .app import SERVICE, build_app
from .scheduler import Scheduler
from .settings import SchedulerSettings

NO_KEY = """gpufleet-scheduler: GPUFLEET_SECRET_KEY is not set.
The scheduler stores job secrets (env values) encrypted with this Fernet key; make one with
  python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"
and give the provisioner the same one. (`just up` makes one for the local stack.)
For development only, GPUFLEET_EPHEMERAL_SECRET_KEY=1 runs with a key made at start: secrets
of jobs stored before a restart then cannot be read, and such jobs fail."""


def checked_settings() -> SchedulerSettings:
    """The settings, or exit 2 without a usable secret key."""
    settings = SchedulerSettings()
    if settings.secret_key is None and not env_flag("GPUFLEET_EPHEMERAL_SECRET_KEY"):
        print(NO_KEY, file=sys.stderr)
        sys.exit(2)
    if settings.secret_key is not None:
        try:
            SecretBox(settings.secret_key)
        except ValueError as exc:
            print(f"gpufleet-scheduler: {exc}", file=sys.stderr)
            sys.exit(2)
    return settings


def main() -> None:
    settings = checked_settings()

    def build(ports: Ports) -> Service[Scheduler]:
        return build_app(ports, settings)

    run_service(SERVICE, build)


if __name__ == "__main__":
    main()
