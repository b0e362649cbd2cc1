"""Which configurations a device was told to run (views.configs_told), on plain data: its
current deployment's and the last it ran, with their keys and checkpoints; those of no other
configuration."""

from __future__ import annotations

from gpufleet_device_fleet.views import configs_told


def spec(image: str, keys: list[str], checkpoints: list[str] | None = None) -> dict[str, object]:
    return {
        "image": image,
        "model": "m",
        "start_command": "run",
        "keys": keys,
        "checkpoints": checkpoints or [],
    }


def test_the_current_deployment_s_and_the_last_good_configuration() -> None:
    doc = {
        "minion_id": "jx-1",
        "owner": "acme",
        "config": "set-but-never-deployed",
        "pending": {"config_name": "new", "spec": spec("new:1", ["aws"], ["ck"])},
        "last_good": {"config_name": "old", "spec": spec("old:1", ["wasabi"])},
    }
    told = configs_told(doc)
    assert told.owner == "acme" and told.minion_id == "jx-1"
    assert [(c.image, c.keys) for c in told.configs] == [("new:1", ["aws"]), ("old:1", ["wasabi"])]
    assert [c.checkpoints for c in told.configs] == [["ck"], []]


def test_a_device_never_told_anything_has_no_configuration() -> None:
    assert configs_told({"minion_id": "jx-1", "owner": "acme", "config": "c"}).configs == []
