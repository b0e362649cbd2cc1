"""Pure rules of platform objects' names: how an output is named after its job, how another
account's public object is addressed, where an object's bytes live in the bucket."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

from gpufleet_contracts.errors import Refused
from gpufleet_contracts.locations import PlatformAsset
from gpufleet_contracts.platform import OBJECT_NAME_CHARS
from gpufleet_contracts.subjects import ACCOUNT_RE

RULE = "R-JOB-3"
# a name: one path segment of letters, digits, spaces and `._-` (a job's name is one)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")


def name_problem(name: str) -> str | None:
    if len(name) > OBJECT_NAME_CHARS:
        return f"at most {OBJECT_NAME_CHARS} characters"
    if not NAME_RE.fullmatch(name) or name.endswith((" ", ".")):
        return "letters, digits, spaces and . _ - (starting with a letter or digit)"
    return None


def refused_name(field: str, name: str, why: str) -> Refused:
    return Refused(
        "invalid",
        f"{field} {name!r}: {why}",
        [{"field": field, "rule": RULE, "message": why}],
    )


def checked(name: str, field: str = "name") -> str:
    why = name_problem(name)
    if why is not None:
        raise refused_name(field, name, why)
    return name


def addressed(name: str, account: str) -> tuple[str, str]:
    """(owner, name) of `name` as `account` says it: its own `<name>`, or another account's
    `<owner>/<name>` (readable only if public)."""
    owner, sep, rest = name.partition("/")
    if not sep:
        return account, checked(name)
    if not ACCOUNT_RE.fullmatch(owner) or "/" in rest:
        raise refused_name("name", name, "a name, or <owner>/<name> for a public object")
    return owner, checked(rest)


def output_name(base: str, taken: Iterable[str]) -> str:
    """The name of a job's new object: `base` (the job's name) unless the account has one of
    that name, else `<base>-<n>` with the smallest n >= 2 not taken."""
    used = set(taken)
    if base not in used:
        return base
    n = 2
    while f"{base}-{n}" in used:
        n += 1
    return f"{base}-{n}"


def object_key(account: str, asset: PlatformAsset) -> str:
    """Where a new object's bytes go in the bucket: its own key, so that a name removed and
    made again never meets the old bytes (and a key says nothing of the name)."""
    return f"platform/{account}/{asset.value}/{uuid.uuid4().hex}.zip"
