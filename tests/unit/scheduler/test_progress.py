"""A worker's staging progress as the line `job show` and the job's reason give."""

from __future__ import annotations

from gpufleet_scheduler.progress import text


def item(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "/opt/ml/input",
        "direction": "download",
        "kind": "s3",
        "names": "s3://b/train.tar",
        "done": 0,
        "total": None,
        "rate": 0,
        "state": "pending",
    }
    return {**base, **kw}


def test_a_download_reads_how_far_of_how_much_and_how_fast() -> None:
    moving = item(done=1_200_000_000, total=4_000_000_000, rate=95_000_000, state="fetching")
    assert text([moving]) == "downloading s3://b/train.tar: 1.2 of 4.0 GB, 95 MB/s"
    unknown = item(done=3_500_000, rate=1_000_000, state="fetching")
    assert text([unknown]) == "downloading s3://b/train.tar: 3.5 MB, 1 MB/s"


def test_an_upload_names_its_archive_and_where_it_goes() -> None:
    up = item(
        name="train_1.zip",
        direction="upload",
        names="s3://b/out",
        done=12_000_000,
        total=40_000_000,
        state="fetching",
    )
    assert text([up]) == "uploading train_1.zip to s3://b/out: 12.0 of 40.0 MB"


def test_nothing_on_its_way_says_nothing() -> None:
    assert text([]) is None
    assert text([item(state="done", done=5, total=5)]) is None
    assert text([item(total=2_000)]) == "downloading s3://b/train.tar: 0.0 of 2.0 kB (not begun)"


def test_local_data_not_sent_says_the_job_waits_for_you() -> None:
    waiting = item(kind="local", names="~/data", state="waiting")
    moving = item(done=1_000, total=2_000, state="fetching")
    assert text([waiting, moving]) == ("waiting for you to connect (~/data: gpufleet job connect)")


def test_a_datastore_that_does_not_answer_says_so() -> None:
    held = item(
        name="datastore nas",
        kind="datastore",
        names="datastore nas",
        state="waiting",
        reason="datastore nas unreachable",
    )
    local = item(kind="local", names="~/data", state="waiting")
    assert text([held, local]) == "waiting: datastore nas unreachable"
