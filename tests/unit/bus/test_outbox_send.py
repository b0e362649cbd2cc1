"""The outbox relay's checks before `nc.publish`, and its reading of JetStream's acks.

`nc.publish` itself is nats-py's (tests/integration/bus/test_outbox_*.py publish to a real
nats-server); here a stand-in records what would be published, to show that a message that
can never be published is refused before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_bus.outbox_wire import ack_error as _ack_error
from gpufleet_bus.outbox_wire import send as _send
from gpufleet_bus.outbox_wire import too_big as _too_big
from nats import errors as nats_errors
from nats.aio.msg import Msg

pytestmark = pytest.mark.unit
SUBJECT = "gpufleet.v1.evt.test.sent"


def frame_size(payload: bytes, headers: dict[str, str]) -> int:
    """Headers and body as the NATS protocol counts them for HPUB (what max_payload bounds):
    "NATS/1.0\\r\\n", "key: value\\r\\n" per header (stripped), "\\r\\n", then the body."""
    lines = "".join(f"{k.strip()}: {v.strip()}\r\n" for k, v in headers.items())
    return len(f"NATS/1.0\r\n{lines}\r\n".encode()) + len(payload)


HEADERS = [
    {"ce-id": "abc", "Nats-Msg-Id": "abc"},
    {"ce-subject": "gpufleet.v1.evt.t\u00e9st.x", "ce-type": "\u2603 \U0001f680"},  # 2-4 bytes
    {"ce-id": "  padded \t", "content-type": "application/json"},  # stripped, as sent
    {},
]


@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("body", [0, 10, 3_000])
def test_too_big_counts_headers_and_body_as_sent(headers: dict[str, str], body: int) -> None:
    payload = b"x" * body
    size = frame_size(payload, headers)
    values = "".join(headers.values())
    assert not _too_big(payload, headers, values, size)  # exactly at the limit: fits
    assert _too_big(payload, headers, values, size - 1)
    assert not _too_big(payload, headers, values, 10 * size + 1_000)  # far below: no encoding


class Recorder:
    """What a connected nats-py client is asked to publish, and its max_payload."""

    def __init__(self, max_payload: int = 1024 * 1024) -> None:
        self.max_payload = max_payload
        self.sent: list[tuple[str, bytes, str, dict[str, str] | None]] = []

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.sent.append((subject, payload, reply, headers))


async def send(nc: Recorder, subject: str, payload: bytes, headers: dict[str, str]) -> None:
    await _send(nc, subject, payload, "_INBOX.x.1", headers)  # type: ignore[arg-type]


async def test_a_message_that_fits_is_published_as_it_is() -> None:
    nc, headers = Recorder(), {"ce-id": "m1", "Nats-Msg-Id": "m1"}
    await send(nc, SUBJECT, b"{}", headers)
    assert nc.sent == [(SUBJECT, b"{}", "_INBOX.x.1", headers)]


async def test_headers_and_body_over_max_payload_are_refused_before_sending() -> None:
    headers = {"ce-id": "m1", "Nats-Msg-Id": "m1"}
    body = b"x" * 100
    nc = Recorder(max_payload=frame_size(body, headers) - 1)  # the body alone would fit
    with pytest.raises(nats_errors.MaxPayloadError):
        await send(nc, SUBJECT, body, headers)
    assert nc.sent == []


@pytest.mark.parametrize("subject", ["", f"{SUBJECT}.not one", f"{SUBJECT}\r\nPUB x 1"])
async def test_a_subject_the_protocol_line_cannot_carry_is_refused(subject: str) -> None:
    nc = Recorder()
    with pytest.raises(nats_errors.BadSubjectError):
        await send(nc, subject, b"{}", {"ce-id": "m1"})
    assert nc.sent == []


async def test_a_line_break_in_a_header_value_goes_out_as_a_space() -> None:
    nc = Recorder()
    await send(nc, SUBJECT, b"{}", {"ce-id": "m1\r\nX-Injected: 1", "ce-type": "t"})
    ((_, _, _, headers),) = nc.sent
    assert headers == {"ce-id": "m1  X-Injected: 1", "ce-type": "t"}


def ack(data: bytes, headers: dict[str, str] | None = None) -> Msg:
    return Msg(_client=None, subject="_INBOX.x.1", data=data, headers=headers)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (ack(b'{"stream":"GPUFLEET_EVENTS","seq":7}'), None),
        (ack(b'{"stream":"GPUFLEET_EVENTS","seq":7,"duplicate":true}'), None),
        (ack(b'{"stream":"GPUFLEET_EVENTS","domain":"hub","seq":7}'), None),
        (ack(b'{ "stream": "GPUFLEET_EVENTS", "seq": 7 }'), None),  # other spacing: decoded
        (
            ack(
                b'{"error":{"code":400,"err_code":10054,"description":"message size exceeds'
                b' maximum allowed"},"stream":"GPUFLEET_EVENTS"}'
            ),
            "message size exceeds maximum allowed",
        ),
        (ack(b'{"stream":"x","error":{"code":503}}'), "{'code': 503}"),
        (ack(b"", {"Status": "503"}), "status 503"),
        (ack(b"", {"Status": "503", "Description": "No Responders"}), "status 503 No Responders"),
        (ack(b"not json"), "unreadable ack b'not json'"),
    ],
)
def test_an_ack_is_a_pub_ack_or_says_why_not(msg: Msg, error: Any) -> None:
    assert _ack_error(msg) == error
