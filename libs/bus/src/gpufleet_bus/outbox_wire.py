"""One outbox message on the wire: the checks that make a message that can never be
published fail before anything is sent, the publish itself (nats-py's public
`nc.publish`), and reading JetStream's answer (outbox.py)."""

from __future__ import annotations

import functools
import json
import re

from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import Header

from .streams import stream_for


async def send(
    nc: Client, subject: str, payload: bytes, reply: str, headers: dict[str, str]
) -> None:
    """`nc.publish(subject, payload, reply=reply, headers=headers)`, after the checks that make
    a message that can never be published fail here, before anything is sent:

    MaxPayloadError when headers and body together exceed the server's max_payload (nats-py
    checks the body alone, and the server closes a connection that sends more);
    BadSubjectError for a subject the protocol line cannot carry (empty, or with whitespace).
    Text that cannot be encoded makes nats-py raise UnicodeEncodeError, before it sends.

    A line break in a header value would end the header line: nats-py 2.16 turns it into a
    space, earlier versions send it as it is, so it is done here for them (values never hold
    one but for a bug: one `in` test on all the values together)."""
    values = "".join(headers.values())
    if "\r" in values or "\n" in values:
        headers = {k: v.replace("\r", " ").replace("\n", " ") for k, v in headers.items()}
        values = "".join(headers.values())
    if too_big(payload, headers, values, nc.max_payload):
        raise nats_errors.MaxPayloadError
    if not subject or _BAD_SUBJECT.search(subject):
        raise nats_errors.BadSubjectError
    await nc.publish(subject, payload, reply=reply, headers=headers)


EXPECTED_STREAM = Header.EXPECTED_STREAM.value
_BAD_SUBJECT = re.compile(r"[ \t\r\n]")  # what nats-py 2.16's publish refuses in a subject
# "NATS/1.0\r\n", then "key: value\r\n" per header, then "\r\n": nats-py's header block
_HEADER_FRAME = len(b"NATS/1.0\r\n\r\n")
_HEADER_LINE = len(b": \r\n")


def too_big(payload: bytes, headers: dict[str, str], values: str, max_payload: int) -> bool:
    """Whether headers and body together exceed the server's max_payload, as nats-py sends
    them (keys and values stripped). `values` is every value, joined. Counted in characters
    first, at most 4 bytes each in UTF-8: nearly every message is far below the limit and
    needs no encoding here."""
    fixed = len(payload) + _HEADER_FRAME + _HEADER_LINE * len(headers)
    if fixed + 4 * (len(values) + sum(map(len, headers))) <= max_payload:
        return False
    exact = sum(len(k.strip().encode()) + len(v.strip().encode()) for k, v in headers.items())
    return fixed + exact > max_payload


@functools.lru_cache(maxsize=1024)
def stream_of(subject: str) -> str | None:
    """`stream_for`, once per subject: a service publishes on few."""
    return stream_for(subject)


def ack_error(msg: Msg) -> str | None:
    """Why JetStream did not store a message, or None for a PubAck (a duplicate included)."""
    if msg.headers and "Status" in msg.headers:  # 503: no stream holds the subject
        return f"status {msg.headers['Status']} {msg.headers.get('Description', '')}".strip()
    data = msg.data
    if data.startswith(b'{"stream":') and b'"error"' not in data:
        return None  # a PubAck, as the server writes it: no JSON decoding per message
    try:
        ack = json.loads(msg.data)
    except ValueError:
        return f"unreadable ack {msg.data[:200]!r}"
    if "error" in ack:
        return str(ack["error"].get("description", ack["error"]))
    return None
