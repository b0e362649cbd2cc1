import asyncio
import sys

from gpufleet_bus import env_flag, make_broker
from gpufleet_store import SecretBox, Store

from .app import SERVICE, build_app, settings_from_env

NO_KEY = """gpufleet-scheduler: GPUFLEET_SECRET_KEY is not set.
The scheduler stores job secrets (env values) encrypted with this Fernet key; make one with
  python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"
and give the provisioner the same one. (`just up` makes one for the local stack.)
For development only, GPUFLEET_EPHEMERAL_SECRET_KEY=1 runs with a key made at start: secrets
of jobs stored before a restart then cannot be read, and such jobs fail."""


def main() -> None:
    settings = settings_from_env()
    if settings.secret_key is None and not env_flag("GPUFLEET_EPHEMERAL_SECRET_KEY"):
        print(NO_KEY, file=sys.stderr)
        sys.exit(2)
    if settings.secret_key is not None:
        try:
            SecretBox(settings.secret_key)
        except ValueError as exc:
            print(f"gpufleet-scheduler: {exc}", file=sys.stderr)
            sys.exit(2)
    app, _ = build_app(Store.connect(SERVICE), make_broker(SERVICE), settings=settings)
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
