"""What a regional datastore may be (R-RES-1, R-RES-2, R-TEN-3): pure rules over an
AddDatastore and the facts given of its region (the provisioner's, device-fleet's count).
Each refusal names its field and rule; the first one found is raised."""

from __future__ import annotations

from gpufleet_contracts.datastores import (
    OPTIONS_VALID,
    USERNAME,
    AddDatastore,
    DatastoreType,
    RegionFacts,
    address_problem,
    options_problem,
    password_problem,
    root_problem,
)
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.fields import name_problem
from gpufleet_contracts.identity import plan_allows_regional

USERNAME_VALID = "1-64 letters, digits, . _ @ $ -, starting with a letter or digit"


def invalid(field: str, rule: str, says: str, valid: str | None = None) -> Refused:
    return Refused.of_field(
        "invalid", f"{field}: {says}", field=field, rule=rule, says=says, valid=valid
    )


def check_share(body: AddDatastore) -> None:
    """The datastore's own fields: its name, server, root, mount options and credentials."""
    problem = name_problem(body.name)
    if problem is not None:
        raise invalid("name", "R-RES-2", problem)
    problem = address_problem(body.address)
    if problem is not None:
        raise invalid("address", "R-RES-2", problem, "a host name or an IP address of the LAN")
    problem = root_problem(body.type, body.root_path)
    if problem is not None:
        raise invalid("root_path", "R-RES-2", problem, "an absolute path on the server")
    problem = options_problem(body.type, body.mount_options)
    if problem is not None:
        raise invalid("mount_options", "R-RES-2", problem, OPTIONS_VALID[body.type])
    if body.type is DatastoreType.nfs:
        for field in ("username", "password"):
            if getattr(body, field) is not None:
                raise invalid(field, "R-RES-2", "for SMB datastores only")
        return
    if (body.username is None) != (body.password is None):
        field = "password" if body.password is None else "username"
        raise invalid(field, "R-RES-2", "an SMB user has both a username and a password")
    if body.username is not None and USERNAME.fullmatch(body.username) is None:
        raise invalid("username", "R-RES-2", "not a user name", USERNAME_VALID)
    if body.password is not None:
        problem = password_problem(body.password.get_secret_value())
        if problem is not None:
            raise invalid("password", "R-RES-2", problem)


def check_region(facts: RegionFacts, devices: int, region: str) -> None:
    """R-TEN-3: a `team` or higher plan; R-RES-1: a region with a compute node or device."""
    if not plan_allows_regional(facts.plan):
        raise invalid(
            "region",
            "R-TEN-3",
            f"regional datastores need a team or enterprise plan; this account's is {facts.plan}",
            "team | enterprise",
        )
    if facts.compute_nodes + devices == 0:
        raise invalid(
            "region",
            "R-RES-1",
            f"region {region!r} has no compute node or device",
            "a region with at least one compute node or device",
        )
