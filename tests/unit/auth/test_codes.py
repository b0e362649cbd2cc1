"""One-time codes: the store keeps a hash and a box that only the code opens."""

from __future__ import annotations

import pytest
from gpufleet_auth.codes import code_id, new_code, open_under, seal_under
from gpufleet_auth.sealing import SealError


def test_only_the_code_opens_its_box_and_the_id_reveals_neither() -> None:
    code, other = new_code(), new_code()
    box = seal_under(code, "the credential")
    assert open_under(code, box) == "the credential"
    assert "the credential" not in box and code not in box
    with pytest.raises(SealError):
        open_under(other, box)
    with pytest.raises(SealError):
        open_under(code, box[:-8] + "AAAAAAA=")
    assert code_id(code) != code_id(other) and code not in code_id(code)
    assert len(code) == 43 and code != other
