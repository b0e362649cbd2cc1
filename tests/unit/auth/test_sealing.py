"""A node's sealing key and the sealed box (gpufleet_auth.sealing), on plain data."""

from __future__ import annotations

import base64
import re
import stat
from pathlib import Path

import pytest
from gpufleet_auth import sealing
from gpufleet_auth.creds import new_user_key, public, seed_of
from gpufleet_auth.sealing import EarlierKey, SealError, SealingKey

VALUE = b"hf_s3cr3t-value"


def test_a_key_is_made_once_0600_and_loaded_again(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sealing.key"
    made = SealingKey.load(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = SealingKey.load(path)
    assert again.public_key == made.public_key and again.key_id == made.key_id
    assert re.fullmatch(sealing.PUBLIC_KEY_PATTERN, made.public_key)
    assert made.public_key not in path.read_text()  # the file holds the private half
    assert path.read_text().strip() not in repr(made)


def test_a_file_that_is_not_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sealing.key"
    path.write_text("not a key\n")
    with pytest.raises(ValueError, match="does not hold a sealing key"):
        SealingKey.load(path)


def test_what_is_sealed_to_a_key_opens_with_it_alone() -> None:
    node, other = SealingKey.generate(), SealingKey.generate()
    box = sealing.seal(node.public_key, VALUE)
    assert VALUE not in base64.b64decode(box)
    assert node.open(box, sealing.key_id(node.public_key)) == VALUE
    # two seals of one value differ (a fresh ephemeral key each time)
    assert sealing.seal(node.public_key, VALUE) != box
    # another key: told apart by the key id it was sealed to
    with pytest.raises(EarlierKey):
        other.open(box, node.key_id)
    # the same key id, another key's box (or a tampered one): does not open, says nothing
    with pytest.raises(SealError) as refused:
        node.open(sealing.seal(other.public_key, VALUE), node.key_id)
    assert "hf_" not in str(refused.value)
    raw = bytearray(base64.b64decode(box))
    raw[-1] ^= 1
    with pytest.raises(SealError):
        node.open(base64.b64encode(bytes(raw)).decode(), node.key_id)
    with pytest.raises(SealError):
        node.open("not base64!", node.key_id)


def test_only_a_real_public_key_is_usable() -> None:
    assert sealing.usable(SealingKey.generate().public_key)
    zero = base64.b64encode(bytes(32)).decode()  # a low-order point: no shared secret
    for bad in (None, zero, "short", base64.b64encode(bytes(31)).decode()):
        assert not sealing.usable(bad)
    with pytest.raises(ValueError):
        sealing.seal(zero, VALUE)


def test_a_node_vouches_for_its_key_with_its_nkey_and_nothing_else_does() -> None:
    node, operator = new_user_key(), new_user_key()
    key = SealingKey.generate().public_key
    signature = sealing.vouch(seed_of(node), key)
    assert sealing.vouched(public(node), key, signature)
    # another key with the node's word for this one, or this key with another's word
    assert not sealing.vouched(public(node), SealingKey.generate().public_key, signature)
    assert not sealing.vouched(public(node), key, sealing.vouch(seed_of(operator), key))
    for bad in (None, "", "not base64!", base64.b64encode(bytes(64)).decode()):
        assert not sealing.vouched(public(node), key, bad)
    assert not sealing.vouched("not an nkey", key, signature)
