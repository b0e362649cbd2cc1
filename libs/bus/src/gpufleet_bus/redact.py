"""What a dead-letter record may keep of a refused message: never a secret.

A refused message is often refused because it is malformed, and a malformed message can
hold anything: an `enable_provider` body wrapped in a JSON array still carries the whole
service-account key. So every record goes through `redact` (pure, no I/O), which drops:

- the value of every key that names a secret (`SECRET_KEYS`, or a name made of one of
  `SECRET_WORDS`, or any `<something>_key`), at any depth of objects and arrays,
  case-insensitively and whatever the spelling (`privateKey`, `PRIVATE-KEY`, `hf_token`);
- the values of environment variables (`ENV_KEYS`): the names are kept, the values are not;
- inside any string: PEM blocks (`-----BEGIN ... PRIVATE KEY-----`, a NATS credential's
  `-----BEGIN NATS USER JWT-----` and `USER NKEY SEED`), DER keys in base64 without their
  PEM lines, NATS seeds (`SU...`, `SA...`, `SO...`), JWTs (`eyJ...`), and `key=value` or
  `"key": "value"` pairs of secret keys in free text; a string that holds JSON is parsed
  and redacted as JSON.

A body that is not JSON is kept only as its size, its SHA-256 and a short redacted excerpt
(`opaque_body`): never the raw bytes, nor their base64.

Over-redacting costs an operator a detail; under-redacting leaks a tenant's key into a
stream kept 90 days. When in doubt, a rule here redacts.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from gpufleet_contracts.secrets import REDACTED  # one marker everywhere: "<secret>"

# Keys whose value is a secret, spelled as `_normalize` spells them (lower snake case).
SECRET_KEYS = frozenset(
    {
        "private_key",
        "private_key_id",
        "password",
        "passwd",
        "passphrase",
        "secret",
        "client_secret",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "join_token",
        "api_key",
        "apikey",
        "key",
        "key_json",
        "service_account_key",
        "credentials",
        "credential",
        "creds",
        "seed",
        "nkey",
        "jwt",
        "authorization",
        "attached_keys",  # StartWorker's third-party key values
        "sealed_secrets",  # StartWorker's secrets sealed to its node: not kept either
        "secrets",
        "cookie",
        "set_cookie",
    }
)
# A key containing one of these words (`aws_secret_access_key`, `hf_token`, `db_password`)
# names a secret too; so does a key ending in `_key` (`stripe_key`, `ssh_key`): an attached
# key. `public_key` and friends are not secrets.
SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "credentials",
        "creds",
        "seed",
        "nkey",
        "jwt",
        "apikey",
        "privatekey",
    }
)
NOT_SECRET_KEYS = frozenset({"public_key", "public_key_id", "idempotency_key"})
# Environment variables: names kept, values dropped.
ENV_KEYS = frozenset({"env", "envs", "env_vars", "environment_variables"})

EXCERPT_CHARS = 160
_EXCERPT_SCAN = 4096  # bytes of an opaque body the excerpt is redacted from

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NON_WORD = re.compile(r"[^a-z0-9]+")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# A PEM block (any label: keys, NATS credentials; certificates are no loss), its END line
# or, cut short, the rest of the string. NATS `.creds` files end theirs with six dashes.
_PEM = re.compile(r"-{5,}\s*BEGIN ([A-Z0-9 ]+?)\s*-{5,}.*?(?:-{5,}\s*END \1\s*-{5,}|\Z)", re.DOTALL)
# A DER key or certificate in base64 without its PEM lines (may hold escaped newlines).
_DER = re.compile(r"MII[A-Za-z0-9+/]{20}(?:[A-Za-z0-9+/=]|\\n|\\r|\s){40,}")
# NATS nkey seeds: 'S', the kind (operator, account, user, server, cluster, curve), base32.
_SEED = re.compile(r"\bS[OAUNCX][A-Z2-7]{56}\b")
# A JWT (NATS user and account JWTs, OAuth tokens): three base64url parts, `eyJ` = '{"'.
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
# `password=hunter2`, `"token": "abc"`, `api-key: x` in free text (a malformed body).
_PAIR_WORDS = (
    r"private[_-]?key(?:[_-]?id)?|key[_-]?json|service[_-]?account[_-]?key|api[_-]?key|"
    r"client[_-]?secret|secret[_-]?access[_-]?key|access[_-]?key|[a-z_-]*token|"
    r"password|passwd|passphrase|secret|credentials?|creds|seed|authorization"
)
_PAIR = re.compile(
    rf"""(?P<key>["']?\b(?:{_PAIR_WORDS})\b["']?\s*[:=]\s*)"""
    r"""(?P<value>"(?:[^"\\]|\\.)*"?|'[^']*'?|[^\s,;&}\]]+)""",
    re.IGNORECASE,
)


def _normalize(key: str) -> str:
    """`privateKey`, `Private-Key`, `PRIVATE_KEY` -> `private_key`."""
    return _NON_WORD.sub("_", _CAMEL.sub("_", key).lower()).strip("_")


def is_secret_key(key: str) -> bool:
    """Whether the value of `key` is a secret (see SECRET_KEYS and SECRET_WORDS)."""
    name = _normalize(key)
    if name in NOT_SECRET_KEYS:
        return False
    if name in SECRET_KEYS or name.endswith("_key"):
        return True
    words = name.split("_")
    return any(w in SECRET_WORDS for w in words) or "".join(words) in SECRET_KEYS


def is_env_key(key: str) -> bool:
    return _normalize(key) in ENV_KEYS


def redact(value: Any) -> Any:
    """`value` (decoded JSON: objects, arrays, strings, numbers) without its secrets."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            if is_secret_key(key):
                out[key] = REDACTED
            elif is_env_key(key):
                out[key] = _env(v)
            else:
                out[key] = redact(v)
        return out
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _env(value: Any) -> Any:
    """Environment variables in any usual shape: names kept, values dropped."""
    if isinstance(value, dict):
        if "name" in value and "value" in value:  # [{"name": ..., "value": ...}]
            return {**redact({k: v for k, v in value.items() if k != "value"}), "value": REDACTED}
        return {str(k): REDACTED for k in value}
    if isinstance(value, list | tuple):
        return [_env(v) for v in value]
    if isinstance(value, str):
        name, sep, _ = value.partition("=")
        if sep and _ENV_NAME.fullmatch(name):
            return f"{name}={REDACTED}"
        if _ENV_NAME.fullmatch(value):  # only a variable's name (a mount's `env`)
            return value
        return REDACTED
    if value is None or isinstance(value, bool | int | float):
        return value
    return REDACTED


def redact_text(text: str) -> str:
    """A string without secrets; a string holding JSON is redacted as JSON."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        try:
            inner = json.loads(stripped)
        except ValueError:
            pass
        else:
            return json.dumps(redact(inner))
    text = _PEM.sub(REDACTED, text)
    text = _DER.sub(REDACTED, text)
    text = _SEED.sub(REDACTED, text)
    text = _JWT.sub(REDACTED, text)
    return _PAIR.sub(lambda m: f"{m.group('key')}{REDACTED}", text)


def opaque_body(raw: bytes) -> dict[str, Any]:
    """What a record keeps of a body that is not JSON: its size, its SHA-256 and a short
    excerpt of its text (redacted, control characters shown as '.'), never its bytes."""
    text = raw[:_EXCERPT_SCAN].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() or c == " " else "." for c in text)
    excerpt = redact_text(text)
    if len(excerpt) > EXCERPT_CHARS:
        excerpt = excerpt[:EXCERPT_CHARS] + "..."
    return {
        "payload_size": len(raw),
        "payload_sha256": hashlib.sha256(raw).hexdigest(),
        "payload_excerpt": excerpt,
    }


def body_fields(raw: bytes) -> dict[str, Any]:
    """The `payload*` fields of a dead-letter record for the bytes `raw`: the JSON value,
    redacted; or, for anything else, `opaque_body`."""
    try:
        decoded = json.loads(raw)
    except ValueError:  # not UTF-8 (UnicodeDecodeError) or not JSON (JSONDecodeError)
        return {"payload": None, "payload_encoding": "opaque", **opaque_body(raw)}
    return {"payload": redact(decoded), "payload_encoding": "json", "payload_size": len(raw)}
