"""The join token: what an operator hands a new node (R-NODE-2).

`GFJ1.<base64url JSON>` holding an enrolment-only credential (it may publish only
`gpufleet.v1.enroll.<minion_id>`, and expires), the one-time secret the provisioner stores
hashed, and the minion id it enrols. Treat it as a secret until it is spent.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from .creds import Creds

PREFIX = "GFJ1."


class JoinTokenError(ValueError):
    """Not a join token, or a damaged one."""


@dataclass(frozen=True)
class JoinToken:
    creds: Creds
    secret: str
    minion_id: str

    def text(self) -> str:
        body = {"creds": self.creds.text(), "secret": self.secret, "minion_id": self.minion_id}
        return PREFIX + base64.urlsafe_b64encode(json.dumps(body).encode()).decode()

    @classmethod
    def parse(cls, text: str) -> JoinToken:
        text = text.strip()
        if not text.startswith(PREFIX):
            raise JoinTokenError(f"not a gpufleet join token ({PREFIX}…)")
        try:
            body = json.loads(base64.urlsafe_b64decode(text[len(PREFIX) :]))
            return cls(Creds.parse(body["creds"]), str(body["secret"]), str(body["minion_id"]))
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise JoinTokenError("a damaged join token") from exc
