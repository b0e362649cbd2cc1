"""Who is speaking is read from the subject the server let through (gpufleet_bus.accounts)."""

from __future__ import annotations

import pytest
from gpufleet_bus import NoAccountError, account_of, node_of, on_its_own_subject


def test_the_acting_account_is_the_subjects_last_token() -> None:
    assert account_of("gpufleet.v1.rpc.scheduler.get_job.acme") == "acme"
    with pytest.raises(NoAccountError):
        account_of("gpufleet.v1.rpc.scheduler.get_job")


def test_a_worker_fact_counts_only_on_the_subject_of_the_node_its_body_names() -> None:
    subject = "gpufleet.v1.evt.worker.finished.evil"
    assert node_of(subject) == "evil"
    assert on_its_own_subject(subject, "evil")
    # `evil` may publish its own subject only; naming the victim's node in the body there
    # (to pass the check against the placement's node) is refused.
    assert not on_its_own_subject(subject, "local-node-1")
