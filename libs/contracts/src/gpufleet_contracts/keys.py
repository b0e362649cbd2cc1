"""An account's attached third-party keys (R-JOB-7): what each type holds, and the requests.

An account's users attach a key once per type (`gpufleet key add huggingface`); a job names
the types it uses (`environment.keys: [huggingface, docker]`) and gets the values of its
creator's keys. One key per type and account: attaching a type again replaces it.

Values are secrets: kept by the scheduler sealed with its key, never in an event, a reply,
a log or a dead letter (the request's `secret` field is redacted there as a whole). A key is
shown by its type, the names of its fields, when it was attached and a fingerprint (an
HMAC made with the scheduler's key: it tells two values apart, and cannot be checked against
a guess without that key).

Registry keys (`docker`, `ngc`: gpufleet_contracts.images) are used for a job's image pull
only; every other type is given to the job's workers alone, as files
`/run/secrets/<type>/<field>` (services/node-agent/README.md, "Attached keys").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError

from . import subjects
from .base import Command
from .errors import rule
from .jobspec import THIRD_PARTY_KEYS

KEY_VALUE_CHARS = 16384  # a GCP service-account JSON is ~2,400 characters
KEY_FIELD_CHARS = 64


@dataclass(frozen=True)
class KeyKind:
    """The fields of one key type: those it must have and those it may have."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        return self.required + self.optional

    def describe(self) -> str:
        opt = [f"{f} (optional)" for f in self.optional]
        return ", ".join([*self.required, *opt])


# Every type of THIRD_PARTY_KEYS, and its fields (tests/unit/contracts: one per type).
KEY_KINDS: dict[str, KeyKind] = {
    "aws": KeyKind(("access_key_id", "secret_access_key"), ("session_token", "region")),
    "azure": KeyKind(("account_name", "account_key")),
    "gcp": KeyKind(("key_json",)),
    "wasabi": KeyKind(("access_key_id", "secret_access_key"), ("region",)),
    # registry keys: the pull's credential, never given to the job (images.py)
    "docker": KeyKind(("username", "password"), ("registry",)),
    "ngc": KeyKind(("api_key",)),
    "huggingface": KeyKind(("token",)),
    "wandb": KeyKind(("api_key",)),
    "kaggle": KeyKind(("username", "key")),
    "git": KeyKind(("token",), ("username",)),
    # a git clone over ssh (the node's staging): the private key, and the server's host keys
    "ssh": KeyKind(("private_key",), ("known_hosts",)),
}
KEY_TYPES_VALID = ", ".join(THIRD_PARTY_KEYS)


def _refused(message: str, valid: str, **ctx: object) -> PydanticCustomError:
    # Messages name types and fields, never a value (it would reach a dead letter's errors).
    return PydanticCustomError(
        "third_party_key", message, {**ctx, "rule": "R-JOB-7", "valid": valid}
    )


def _check_type(v: str) -> str:
    if v not in KEY_KINDS:
        raise _refused("unknown third-party key type", KEY_TYPES_VALID)
    return v


class KeyView(BaseModel):
    """One attached key, as its account sees it (no value, ever)."""

    type: str
    fields: list[str]
    fingerprint: str
    created_at: str | None = None
    updated_at: str | None = None


class AttachKey(Command):
    """Attach (or replace) the acting account's key of one type: its fields' values, e.g.
    `{type: huggingface, secret: {token: ...}}`. The reply shows the key without its values."""

    TYPE = "gpufleet.key.attach.v1"
    SUBJECT = subjects.rpc("scheduler", "attach_key")
    REPLY = KeyView
    type: str = Field(json_schema_extra=rule("R-JOB-7", **{"x-valid": KEY_TYPES_VALID}))
    # `secret`: a name the dead-letter redaction drops whole (gpufleet_bus.redact)
    secret: dict[str, str] = Field(repr=False, json_schema_extra=rule("R-JOB-7"))

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        return _check_type(v)

    @field_validator("secret")
    @classmethod
    def _fields(cls, v: dict[str, str], info: Any) -> dict[str, str]:
        kind = KEY_KINDS.get(str(info.data.get("type")))
        if kind is None:
            return v  # the type's own error says why
        unknown = sorted(f for f in v if f not in kind.fields)
        if unknown:
            raise _refused(
                "field(s) {unknown} are not fields of this key type",
                kind.describe(),
                unknown=", ".join(f[:KEY_FIELD_CHARS] for f in unknown),
            )
        missing = [f for f in kind.required if not v.get(f, "").strip()]
        if missing:
            raise _refused(
                "field(s) {missing} are required", kind.describe(), missing=", ".join(missing)
            )
        for name, value in v.items():
            if len(value) > KEY_VALUE_CHARS:
                raise _refused(
                    "field {name} is longer than {limit} characters",
                    f"at most {KEY_VALUE_CHARS} characters",
                    name=name,
                    limit=KEY_VALUE_CHARS,
                )
            if "\x00" in value:
                raise _refused("field {name} holds a NUL character", "text without NUL", name=name)
        # an optional field left empty is not set
        return {k: val for k, val in v.items() if val != "" or k in kind.required}


class KeyList(BaseModel):
    keys: list[KeyView]


class ListKeys(Command):
    """The acting account's attached keys: types, field names, fingerprints; never values."""

    TYPE = "gpufleet.key.list.v1"
    SUBJECT = subjects.rpc("scheduler", "list_keys")
    REPLY = KeyList
    READ = True


class RemoveKey(Command):
    """Remove the acting account's key of this type; jobs that name it and are not yet
    placed fail when they would be."""

    TYPE = "gpufleet.key.remove.v1"
    SUBJECT = subjects.rpc("scheduler", "remove_key")
    REPLY = KeyView
    type: str = Field(json_schema_extra=rule("R-JOB-7", **{"x-valid": KEY_TYPES_VALID}))

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        return _check_type(v)
