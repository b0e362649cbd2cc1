"""Identities on the bus: NATS JWTs, credentials files and the permission table."""

from .authority import Authority, Issuer
from .creds import Creds, connect_options, inbox_prefix, new_user_key, public, write_secret
from .permissions import Grant

__all__ = [
    "Authority",
    "Creds",
    "Grant",
    "Issuer",
    "connect_options",
    "inbox_prefix",
    "new_user_key",
    "public",
    "write_secret",
]
