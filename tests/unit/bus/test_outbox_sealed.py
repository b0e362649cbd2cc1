"""Secrets at rest in the store: the SecretBox, and outbox messages stored sealed."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet
from gpufleet_store import SecretBox, SecretError, Transaction
from gpufleet_store.store import (
    FORMAT,
    FORMAT_SEALED,
    outbox_documents,
    outbox_frames,
    outbox_messages,
)

pytestmark = pytest.mark.unit
SECRET = b"s3cr3t-value"


def box() -> SecretBox:
    return SecretBox(Fernet.generate_key().decode())


def tx_with(b: SecretBox | None) -> Transaction:
    return Transaction(session=None, box=b)  # type: ignore[arg-type]


def test_a_box_seals_and_opens_and_hides_its_key() -> None:
    key = Fernet.generate_key().decode()
    b = SecretBox(key)
    token = b.seal_json({"TOKEN": "s3cr3t-value"})
    assert "s3cr3t" not in token
    assert b.open_json(token) == {"TOKEN": "s3cr3t-value"}
    assert key not in repr(b)
    with pytest.raises(SecretError, match="does not decrypt"):
        box().open_json(token)


def test_a_key_that_is_not_fernet_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="GPUFLEET_SECRET_KEY is not a Fernet key"):
        SecretBox("not-a-key")


def test_the_process_key_is_one_per_process() -> None:
    token = SecretBox.for_process().seal(SECRET)
    assert SecretBox.for_process().open(token) == SECRET


def test_a_sealed_message_is_stored_encrypted_and_opened_with_the_key() -> None:
    b = box()
    tx = tx_with(b)
    tx.emit("s.plain", "t", b'{"n": 1}', "m1")
    tx.emit("s.secret", "t", b'{"env": {"TOKEN": "s3cr3t-value"}}', "m2", sealed=True)
    (doc,) = outbox_documents(tx.outbox)
    assert doc["messages"][0] == FORMAT_SEALED
    assert SECRET not in doc["messages"]
    frames = list(outbox_frames(doc))
    assert [(f[0], f[4]) for f in frames] == [("m1", False), ("m2", True)]
    assert list(outbox_messages(doc, b)) == [
        ("m1", "s.plain", "t", b'{"n": 1}'),
        ("m2", "s.secret", "t", b'{"env": {"TOKEN": "s3cr3t-value"}}'),
    ]


def test_a_sealed_message_needs_the_key_to_be_read() -> None:
    tx = tx_with(box())
    tx.emit("s", "t", SECRET, sealed=True)
    (doc,) = outbox_documents(tx.outbox)
    with pytest.raises(SecretError, match="no key"):
        list(outbox_messages(doc))
    with pytest.raises(SecretError, match="does not decrypt"):
        list(outbox_messages(doc, box()))


def test_without_a_key_a_secret_is_never_written_in_clear() -> None:
    with pytest.raises(RuntimeError, match="no secret key"):
        tx_with(None).emit("s", "t", SECRET, sealed=True)


def test_documents_without_secrets_keep_the_first_format() -> None:
    tx = tx_with(box())
    tx.emit("s", "t", b"{}")
    (doc,) = outbox_documents(tx.outbox)
    assert doc["messages"][0] == FORMAT
    assert list(outbox_messages(doc)) == [(doc_id(tx.outbox[0]), "s", "t", b"{}")]


def doc_id(msg: dict[str, Any]) -> str:
    return str(msg["_id"])
