"""Field types shared by the contracts: integers that are integers, names that print, text a
process can be given, and the caps of `limits.py`.

- `Int`: pydantic's strict int. A JSON number without a fraction or a Python int; never a
  boolean (`true` is not 1), a string ("2") or a float (2.0). The CLI turns its integer flags
  into numbers before it validates (gpufleet_cli.spec.integer). Decimal fields (money, GPU
  fractions) refuse booleans too: pydantic's Decimal does
  (tests/unit/contracts/test_input_validation.py).
- `Name`: a name someone chose and others read, log, or turn into a path or a subject: no
  character of the Unicode categories Cc (controls: NUL, ESC, newline), Cf (format: U+202E
  right-to-left override, U+200B zero-width space), Cs (surrogates), Co (private use), Cn
  (unassigned in Python's Unicode database), Zl, Zp (line and paragraph separators), and no
  leading or trailing whitespace. Spaces inside ("PASCAL VOC") are names too.
- `Arg`, `EnvValue`: text handed to a process (a command's arguments, an environment
  variable's value). Free text, newlines included, but never NUL: no process can receive one
  (the node agent's spawn would fail), and capped in length.

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
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, GetCoreSchemaHandler, GetJsonSchemaHandler, Strict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from . import limits

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


@dataclass(frozen=True)
class Cap:
    """At most `limit` items (or characters) as given, refused with rule `limit:<name>`,
    and shown in the JSON schema (maxItems, maxLength, maxProperties: the AsyncAPI documents).

    Checked before the items are validated: an oversized list costs no more than its length.
    """

    limit: int
    name: str
    unit: str

    def check(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple, dict)) and len(value) > self.limit:
            raise PydanticCustomError(
                "too_big",
                "{count} {unit}, more than the cap of {limit}",
                {
                    "count": len(value),
                    "unit": self.unit,
                    "limit": self.limit,
                    "rule": f"limit:{self.name}",
                    "valid": f"at most {self.limit} {self.unit}",
                },
            )
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        key = _SCHEMA_KEYS.get(str(json_schema.get("type")))
        if key is not None:
            json_schema[key] = self.limit
        return json_schema


_SCHEMA_KEYS = {"array": "maxItems", "string": "maxLength", "object": "maxProperties"}


Name = Annotated[str, AfterValidator(_name)]
Arg = Annotated[str, Cap(limits.ARG_CHARS, "arg_chars", "characters"), AfterValidator(_no_nul)]
EnvValue = Annotated[
    str, Cap(limits.ENV_VALUE_CHARS, "env_value_chars", "characters"), AfterValidator(_no_nul)
]
Argv = Annotated[list[Arg], Cap(limits.COMMAND_ARGS, "command_args", "arguments")]
PackageName = Annotated[Name, Cap(limits.PACKAGE_CHARS, "package_chars", "characters")]
PackageList = Annotated[list[PackageName], Cap(limits.PACKAGES, "packages", "entries")]
