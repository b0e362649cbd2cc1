"""Field types shared by the contracts: integers that are integers, names that print, text a
process can be given.

- `Int`: pydantic's strict int. A JSON number without a fraction or a Python int; never a
  boolean (`true` is not 1), a string ("2") or a float (2.0). The CLI turns its integer flags
  into numbers before it validates (gpufleet_cli.spec.integer). Decimal fields (money, GPU
  fractions) refuse booleans too: pydantic's Decimal does (tests/unit/test_input_validation.py).
- `Name`: a name someone chose and others read, log, or turn into a path or a subject: no
  character of the Unicode categories Cc (controls: NUL, ESC, newline), Cf (format: U+202E
  right-to-left override, U+200B zero-width space), Cs (surrogates), Co (private use), Cn
  (unassigned in Python's Unicode database), Zl, Zp (line and paragraph separators), and no
  leading or trailing whitespace. Spaces inside ("PASCAL VOC") are names too.
- `Arg`, `EnvValue`: text handed to a process (a command's arguments, an environment
  variable's value). Free text, newlines included, but never NUL: no process can receive one
  (the node agent's spawn would fail).

Which `str` fields are names (decided per field, in the models): job, project, region, node,
minion, datastore, dataset, checkpoint and reservation names, mount targets and their
variables, the output archive, package names and versions, `EnqueueJob.request_id` (chosen
by the caller, it becomes part of a job id). Not names: ids the control plane generates or
only looks up (job_id, placement_id, node_id: an odd one is simply "not found"), free text
(`reason`, `log_tail`, `error`), locations with a form of their own (storage paths and URLs,
checked by their type), and what hardware or a cloud reports (NVML names, GPU UUIDs, drive and
NIC names, `CloudInstanceEvent`): refusing those would keep a real node out, and they are
shown, never used as paths or subjects. Fields with a stricter pattern already (identifiers,
environment variable names, image references) keep it. Accounts come from a connection
header (R-TEN-2), not from a payload, and are not checked here.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator, Strict
from pydantic_core import PydanticCustomError

Int = Annotated[int, Strict()]

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
NAME_RULE = (
    "a name has no control, format, surrogate, private-use, unassigned, line or paragraph "
    "separator character (Unicode Cc, Cf, Cs, Co, Cn, Zl, Zp) and no leading or trailing "
    "whitespace"
)
NAME_VALID = "printable characters, no leading or trailing whitespace"
# The rule ids of these checks: the same whatever the field, and whatever model holds it
# (errors.field_errors would otherwise look for a rule by the field's name).
NAME_RULE_ID = "schema:name_chars"
NUL_RULE_ID = "schema:nul_char"


def describe(ch: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`: a character named without printing it."""
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X} {name}".rstrip()


def refused_char(value: str) -> tuple[int, str] | None:
    """The first character of `value` a name may not hold, with its position, or None."""
    if value.isprintable():  # C-speed: False for every C* and Z* character but the space
        return None
    for at, ch in enumerate(value):
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            return at, ch
    return None  # only Zs characters (e.g. a no-break space): allowed inside a name


def name_problem(value: str) -> str | None:
    """Why `value` is not a name (see the module's docstring), or None."""
    found = refused_char(value)
    if found is not None:
        return f"{describe(found[1])} at position {found[0]}"
    if value != value.strip():
        return "leading or trailing whitespace"
    return None


def _name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise PydanticCustomError(
            "name_chars",
            "{problem}: " + NAME_RULE,
            {"problem": problem, "rule": NAME_RULE_ID, "valid": NAME_VALID},
        )
    return value


def _no_nul(value: str) -> str:
    at = value.find("\0")
    if at >= 0:
        raise PydanticCustomError(
            "nul_char",
            "a NUL character (at position {at}) cannot be passed to a process",
            {"at": at, "rule": NUL_RULE_ID, "valid": "text without NUL characters"},
        )
    return value


Name = Annotated[str, AfterValidator(_name)]
Arg = Annotated[str, AfterValidator(_no_nul)]
EnvValue = Annotated[str, AfterValidator(_no_nul)]
Argv = list[Arg]
PackageName = Name
PackageList = list[PackageName]
