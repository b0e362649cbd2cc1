import functools
import logging

from gpufleet_auth import Creds, connect_options
from gpufleet_bus import BusSettings, run_service

from .app import SERVICE, build_app, dead_letter_service
from .enrol import EnrolmentError, enrol
from .settings import AgentSettings

log = logging.getLogger("gpufleet.node_agent")


async def credential(settings: AgentSettings, bus: BusSettings) -> BusSettings:
    """The node's credential: the one it has, or the one its join token is exchanged for."""
    path = bus.nats_creds or settings.agent_state_dir / "node.creds"
    if not path.exists():
        token = settings.token()
        if token is None:
            raise EnrolmentError(
                f"no credential at {path} and no join token: get one with "
                "`gpufleet node token <minion-id> --region <region>` and set GPUFLEET_JOIN_TOKEN"
            )
        tls = connect_options(None, bus.nats_ca)  # TLS only: the token carries the identity
        await enrol(bus.servers, token, settings.minion_id, path, tls=tls)
    adopt_owner(settings, Creds.read(path).tag("account"))
    return bus.model_copy(update={"nats_creds": path})


def adopt_owner(settings: AgentSettings, enrolled_for: str | None) -> None:
    """The node's owner is the account its credential was issued for at enrolment (what the
    provisioner registers it under, R-NODE-2), whatever GPUFLEET_ACCOUNT says: the runtime
    policy runs only that account's jobs outside containers (policy.py)."""
    if enrolled_for and enrolled_for != settings.account:
        log.warning(
            "GPUFLEET_ACCOUNT is %r but this node is enrolled for account %r: using %r",
            settings.account,
            enrolled_for,
            enrolled_for,
        )
        settings.account = enrolled_for


def main() -> None:
    """Enrol if it must (an EnrolmentError: printed, exit status 2), then run."""
    settings = AgentSettings()
    run_service(
        SERVICE,
        functools.partial(build_app, settings=settings),
        uses_store=False,
        credential=functools.partial(credential, settings),
        dead_letters_as=dead_letter_service(settings.minion_id),
        # Idle, FastStream's 0.1 s check for a stop was most of an agent's CPU (issue 15);
        # a stop now takes effect within a second.
        exit_check_s=1.0,
    )


if __name__ == "__main__":
    main()
