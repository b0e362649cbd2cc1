"""Who may call an endpoint: the caller's `Authorization: Bearer gfk_...` key, checked by the
scheduler (VerifyEndpointKey, over the node's own bus connection; the key's id and the
SHA-256 of its secret are sent, never the key) and its verdict kept for the `cache_s` the
scheduler allows. Who may open a notebook: whoever shows its token (in the query, an
Authorization header or the proxy's cookie), checked here against the SHA-256 its worker
keeps (steps/serve.py); the scheduler is not asked."""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import nats.errors
from gpufleet_contracts import subjects
from gpufleet_contracts.serving import (
    EndpointKeyVerdict,
    VerifyEndpointKey,
    key_digest,
    parse_key,
)
from pydantic import ValidationError

from ..staging.platform import Requester

Verdict = Literal["open", "elsewhere", "unknown"]
CACHE_MAX = 10_000  # verdicts kept at most (expired ones dropped first)


class Unavailable(Exception):
    """The control plane did not answer (or not readably): the caller is told to retry."""


@dataclass(frozen=True)
class Presented:
    key_id: str
    digest: str


def presented(authorization: str | None) -> Presented | Literal[False] | None:
    """The key of an `Authorization` header: None when there is none (or not Bearer),
    False when it is malformed."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    parsed = parse_key(value.strip())
    if parsed is None:
        return False
    key_id, secret = parsed
    return Presented(key_id, key_digest(secret))


def notebook_tokens(
    query_token: str | None, authorization: str | None, cookie: str | None
) -> list[str]:
    """The tokens a request shows for a notebook: `?token=`, `Authorization: token <t>` or
    `Bearer <t>`, the proxy's cookie (one of each at most)."""
    shown = [query_token, cookie]
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() in ("token", "bearer"):
            shown.append(value.strip())
    return [t for t in shown if t]


def token_opens(token: str, digest: str | None) -> bool:
    """Is `token` the one whose SHA-256 (hex) is `digest`? In constant time."""
    if digest is None:
        return False
    return hmac.compare_digest(key_digest(token).encode(), digest.encode())


@dataclass
class Verdicts:
    """The scheduler's verdicts on (job, key), asked once per `cache_s`."""

    minion_id: str
    request: Requester
    clock: Callable[[], float] = time.monotonic
    _cache: dict[tuple[str, str, str], tuple[Verdict, float]] = field(default_factory=dict)

    async def verdict(self, job_id: str, key: Presented) -> Verdict:
        """`open`, `elsewhere` or `unknown` (serving.py); Unavailable when nobody answers."""
        k = (job_id, key.key_id, key.digest)
        cached = self._cache.get(k)
        now = self.clock()
        if cached is not None and cached[1] > now:
            return cached[0]
        asked = VerifyEndpointKey(job_id=job_id, key_id=key.key_id, digest=key.digest)
        subject = subjects.as_node(asked.SUBJECT, self.minion_id)
        try:
            raw = await self.request(subject, asked.to_bytes())
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError) as exc:
            raise Unavailable("the control plane did not answer") from exc
        answer = self._read(raw)
        if answer.cache_s > 0:
            if len(self._cache) >= CACHE_MAX:
                self._cache = {c: v for c, v in self._cache.items() if v[1] > now}
                if len(self._cache) >= CACHE_MAX:
                    self._cache.clear()
            self._cache[k] = (answer.verdict, now + answer.cache_s)
        return answer.verdict

    @staticmethod
    def _read(raw: bytes) -> EndpointKeyVerdict:
        try:
            data = json.loads(raw)
        except ValueError:
            raise Unavailable("the control plane's answer is unreadable") from None
        if isinstance(data, dict) and data.get("ok") is False:
            error = data.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            if code == "not_found":  # not a job of this node's, as the scheduler sees it
                return EndpointKeyVerdict(verdict="elsewhere", cache_s=0)
            raise Unavailable(f"the control plane refused: {code}")
        try:
            return EndpointKeyVerdict.model_validate(data)
        except ValidationError:
            raise Unavailable("the control plane's answer is unreadable") from None
