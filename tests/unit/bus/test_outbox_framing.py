"""The outbox document format: a transaction's messages packed in one binary field, chunked."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_store.store import (
    CHUNK_MESSAGES,
    FORMAT,
    outbox_documents,
    outbox_messages,
)

pytestmark = pytest.mark.unit
SUBJECT = "gpufleet.v1.evt.test.counted"


def msg(i: int, payload: bytes = b"{}", subject: str = SUBJECT) -> dict[str, Any]:
    return {"_id": f"id-{i}", "subject": subject, "type": "gpufleet.test.v1", "payload": payload}


def unpacked(docs: list[dict[str, Any]]) -> list[tuple[str, str, str, bytes]]:
    return [m for doc in docs for m in outbox_messages(doc)]


def test_no_messages_no_document() -> None:
    assert outbox_documents([]) == []


def test_round_trip_keeps_every_field_and_the_order() -> None:
    msgs = [
        msg(0, b""),
        msg(1, b"\x00\xff binary \r\n", subject="gpufleet.v1.evt.t\u00e9st.x"),
        msg(2, b'{"n": 2}'),
    ]
    (doc,) = outbox_documents(msgs)
    assert doc["count"] == 3 and doc["published"] is False
    assert doc["messages"][0] == FORMAT
    assert unpacked([doc]) == [(m["_id"], m["subject"], m["type"], m["payload"]) for m in msgs]


def test_many_messages_are_chunked_in_order() -> None:
    n = 2 * CHUNK_MESSAGES + 5
    docs = outbox_documents([msg(i) for i in range(n)])
    assert [d["count"] for d in docs] == [CHUNK_MESSAGES, CHUNK_MESSAGES, 5]
    assert len({d["created_at"] for d in docs}) == 1  # one transaction: one time...
    assert [d["seq"] for d in docs] == sorted(d["seq"] for d in docs)  # ...ordered by seq
    assert [m[0] for m in unpacked(docs)] == [f"id-{i}" for i in range(n)]


def test_large_payloads_start_a_new_chunk_before_4_mb() -> None:
    big = b"x" * (1024 * 1024)
    docs = outbox_documents([msg(i, big) for i in range(9)])
    assert [d["count"] for d in docs] == [3, 3, 3]
    assert all(len(d["messages"]) < 4 * 1024 * 1024 for d in docs)
    assert [m[3] for m in unpacked(docs)] == [big] * 9


def test_later_transactions_sort_after_earlier_ones() -> None:
    (first,), (second,) = outbox_documents([msg(1)]), outbox_documents([msg(2)])
    assert (first["created_at"], first["seq"]) < (second["created_at"], second["seq"])


def test_a_row_of_the_earlier_format_is_still_read() -> None:
    row = {"_id": "old", "subject": "s", "type": "t", "payload": b"p", "published": False}
    assert list(outbox_messages(row)) == [("old", "s", "t", b"p")]


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown format"):
        list(outbox_messages({"_id": "x", "messages": b"\x09rest"}))
