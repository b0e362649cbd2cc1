"""`node show` prints the node's last heartbeat (no NATS): the host's CPU, RAM and disk, each
GPU's live values, and its ECC counts, retired pages or remapped rows and XIDs where it
reports them (R-NODE-6)."""

from __future__ import annotations

import pytest
from gpufleet_cli.main import app

from .test_node_verification import NODE, replying, runner


def test_show_prints_the_last_heartbeat_with_ecc_and_xids(monkeypatch: pytest.MonkeyPatch) -> None:
    telemetry = {
        "minion_id": "box-1",
        "at": "2025-01-01T10:00:00+00:00",
        "cpu_pct": 12.5,
        "ram_used_mb": 10240,
        "disk_used_pct": 42.5,
        "disk_free_gb": 123.5,
        "disk_read_bytes": 1024,
        "disk_write_bytes": 2048,
        "gpus": [
            {
                "index": 0,
                "utilization_pct": 97,
                "memory_used_mb": 120000,
                "temperature_c": 95,
                "power_w": 650.5,
                "ecc_volatile_corrected": 3,
                "ecc_volatile_uncorrected": 1,
                "ecc_aggregate_corrected": 40,
                "ecc_aggregate_uncorrected": 2,
                "remapped_rows_corrected": 4,
                "remapped_rows_uncorrected": 1,
                "remapped_rows_pending": True,
                "xid_events": [{"xid": 79, "at": "2025-01-01T09:59:58+00:00"}],
            },
            {"index": 1, "utilization_pct": 0, "temperature_c": 31},  # no ECC, XIDs unwatched
        ],
    }
    replying(monkeypatch, {**NODE, "telemetry": telemetry})
    out = runner.invoke(app, ["node", "show", "box-1"]).stdout
    assert "CPU 12.5 %, RAM 10240 MB used, disk 42.5 % used (123.5 GB free)" in out
    assert "1024 B read, 2048 B written since boot" in out
    assert "97 % busy, 120000 MB used, 95 C, 650.5 W; ECC corrected/uncorrected:" in out
    assert "volatile 3/1, aggregate 40/2; rows remapped 4/1 (pending a reset); XID 79 at" in out
    assert "0 % busy, 31 C" in out and out.count("ECC") == 1


def test_show_a_node_never_heard(monkeypatch: pytest.MonkeyPatch) -> None:
    replying(monkeypatch, {**NODE, "telemetry": None})
    result = runner.invoke(app, ["node", "show", "box-1"])
    assert result.exit_code == 0 and "gpu 0" not in result.stdout
