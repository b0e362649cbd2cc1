"""Regional datastores on a node (staging/datastores.py, R-RES-2): the operator's roots
(GPUFLEET_REGIONAL_DATASTORES), a DatastoreRef copied from `<root>/<path>` into the mount's
directory within the worker's disk, and nothing outside the root read (`..`, a symlink in
the path or in the tree, one swapped in after the check) nor written (an output zip put
into `<root>/<path>/`); a datastore the node does not have or of another region fails the
worker saying so."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from gpufleet_contracts.jobs import Mount, MountKind
from gpufleet_contracts.locations import DatastoreRef
from gpufleet_node_agent.settings import AgentSettings
from gpufleet_node_agent.staging.datastores import Datastores, copy_beneath, parse_roots
from gpufleet_node_agent.staging.meter import Meter
from gpufleet_node_agent.staging.node import node_staging
from gpufleet_node_agent.staging.registry import Fetchers, Moved, Transfer
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_node_agent.steps.inputs import InputsStep
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker
from pydantic import ValidationError

pytestmark = pytest.mark.unit


def transfer(limit: int = 10**9, heard: list[Moved] | None = None) -> Transfer:
    told = heard if heard is not None else []

    def progress(moved: Moved) -> None:
        told.append(moved)

    return Transfer(keys={}, limit_bytes=limit, progress=progress)


@pytest.fixture
def nas(tmp_path: Path) -> Path:
    """A datastore's root: /sub/a.csv, /sub/deep/b.csv, /top.txt; beside it, a secret."""
    root = tmp_path / "nas"
    (root / "sub/deep").mkdir(parents=True)
    (root / "sub/a.csv").write_text("x,y\n1,2\n")
    (root / "sub/deep/b.csv").write_text("x,y\n3,4\n")
    (root / "top.txt").write_text("top\n")
    (tmp_path / "secret").write_text("not the job's\n")
    return root


def files(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


def test_the_operators_roots_are_parsed_and_checked_at_start_up() -> None:
    assert parse_roots("") == {}
    assert parse_roots(" nas=/mnt/nas/ , smb1=/srv/smb1") == {
        "nas": Path("/mnt/nas"),
        "smb1": Path("/srv/smb1"),
    }
    for bad, says in (
        ("nas", "not name=/root"),
        ("nas=relative/dir", "not an absolute path"),
        ("nas=/a,nas=/b", "named twice"),
        ("=/a", "not name=/root"),
        ("n\x00s=/a", "datastore name"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_roots(bad)
    assert AgentSettings(regional_datastores="nas=/mnt/nas").regional_datastores == "nas=/mnt/nas"
    with pytest.raises(ValidationError, match="not an absolute path"):
        AgentSettings(regional_datastores="nas=mnt/nas")


async def test_a_directory_of_the_datastore_is_copied_under_the_mount(
    tmp_path: Path, nas: Path
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    heard: list[Moved] = []
    stores = Datastores({"nas": nas}, "lab")
    await stores.fetch(
        DatastoreRef(datastore="nas", path="/sub", region="lab"), dest, transfer(heard=heard)
    )
    assert files(dest) == {"a.csv": "x,y\n1,2\n", "deep/b.csv": "x,y\n3,4\n"}
    assert heard[-1].done == len("x,y\n1,2\n") + len("x,y\n3,4\n")
    assert (dest / "a.csv").stat().st_mode & 0o777 == 0o644
    # a file: that file; the root: all of it
    one, whole = tmp_path / "one", tmp_path / "whole"
    one.mkdir()
    whole.mkdir()
    await stores.fetch(DatastoreRef(datastore="nas", path="/sub/deep/b.csv"), one, transfer())
    assert files(one) == {"b.csv": "x,y\n3,4\n"}
    await stores.fetch(DatastoreRef(datastore="nas", path="/"), whole, transfer())
    assert set(files(whole)) == {"sub/a.csv", "sub/deep/b.csv", "top.txt"}


async def test_what_the_node_does_not_have_fails_the_worker_saying_why(
    tmp_path: Path, nas: Path
) -> None:
    stores = Datastores({"nas": nas, "gone": tmp_path / "unmounted"}, "lab")
    cases = [
        (DatastoreRef(datastore="smb9", path="/sub"), "datastore smb9 is not mounted on this node"),
        (DatastoreRef(datastore="gone", path="/sub"), "datastore gone is not mounted on this node"),
        (
            DatastoreRef(datastore="nas", path="/sub", region="paris"),
            "datastore nas is in region paris; this node is in region lab",
        ),
        (DatastoreRef(datastore="nas", path="/nope"), "datastore nas:/nope not found"),
    ]
    for ref, says in cases:
        with pytest.raises(WorkerFailed) as exc:
            await stores.fetch(ref, tmp_path, transfer())
        assert exc.value.reason.startswith(says), exc.value.reason


async def test_nothing_outside_the_root_is_read(tmp_path: Path, nas: Path) -> None:
    stores = Datastores({"nas": nas}, "lab")
    (nas / "out").symlink_to(tmp_path)  # a link in the share to the node's own files
    (nas / "sub/leak").symlink_to(tmp_path / "secret")
    for path, says in (
        ("/../secret", "could resolve outside its root"),
        ("/sub/%2e%2e/%2e%2e/secret", "could resolve outside its root"),
        ("//etc/passwd", "could resolve outside its root"),
        ("/out/secret", "resolves outside the datastore's root"),
        ("/out", "resolves outside the datastore's root"),
        ("/sub", "(sub/leak): a symlink that points outside the datastore's root"),
    ):
        dest = tmp_path / "dest"
        dest.mkdir(exist_ok=True)
        with pytest.raises(WorkerFailed, match=re.escape(says)):
            await stores.fetch(DatastoreRef(datastore="nas", path=path), dest, transfer())
        assert "not the job's\n" not in files(dest).values()
        shutil.rmtree(dest)


async def test_a_symlink_to_a_file_inside_the_root_is_copied_as_that_file(
    tmp_path: Path, nas: Path
) -> None:
    (nas / "sub/latest.csv").symlink_to("deep/b.csv")
    (nas / "sub/top").symlink_to("../top.txt")
    dest = tmp_path / "dest"
    dest.mkdir()
    await Datastores({"nas": nas}, "lab").fetch(
        DatastoreRef(datastore="nas", path="/sub"), dest, transfer()
    )
    assert files(dest)["latest.csv"] == "x,y\n3,4\n" and files(dest)["top"] == "top\n"
    assert not (dest / "latest.csv").is_symlink()
    for link, says in (("dir", "a symlink to a directory"), ("dangling", "points nowhere")):
        (nas / "sub" / link).symlink_to("deep" if link == "dir" else "missing")
        again = tmp_path / link
        again.mkdir()
        with pytest.raises(WorkerFailed, match=says):
            await Datastores({"nas": nas}, "lab").fetch(
                DatastoreRef(datastore="nas", path="/sub"), again, transfer()
            )
        (nas / "sub" / link).unlink()


async def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path, nas: Path
) -> None:
    """Checked, then the share changes before the copy: the copy opens every name from the
    root without following a link, so it fails rather than leaving the root."""
    stores = Datastores({"nas": nas}, "lab")
    found = stores.resolve(DatastoreRef(datastore="nas", path="/sub/deep"))
    os.rename(nas / "sub", nas / "old")
    (nas / "sub").symlink_to(tmp_path)  # /sub now leads out of the root
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep/stolen").write_text("not the job's\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    meter = Meter("x", transfer())
    with pytest.raises(WorkerFailed, match="sub: a symlink, not followed"):
        copy_beneath(found, dest, meter)
    assert files(dest) == {}


async def test_past_the_disk_left_the_copy_fails_too_large(tmp_path: Path, nas: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(WorkerFailed, match="too large"):
        await Datastores({"nas": nas}, "lab").fetch(
            DatastoreRef(datastore="nas", path="/sub"), dest, transfer(limit=10)
        )


async def test_the_inputs_step_fills_a_mount_from_the_nodes_datastore(
    tmp_path: Path, nas: Path
) -> None:
    settings = AgentSettings(
        region="lab", regional_datastores=f"nas={nas}", agent_state_dir=tmp_path / "state"
    )
    fetchers, uploaders = node_staging(settings)
    assert "datastore" in fetchers.by_kind and "datastore" in uploaders.by_kind
    spec = WorkerSpec(
        placement_id="p",
        job_id="j",
        worker=0,
        command=("true",),
        mounts=(
            Mount(
                target="/opt/ml/input",
                kind=MountKind.input,
                source=DatastoreRef(datastore="nas", path="/sub", region="lab"),
                env="ML_DATA_PATH",
            ),
        ),
        disk_size_gb=1,
    )
    w = Worker(spec, tmp_path / "worker")
    await InputsStep(lambda w: [], Fetchers(fetchers.by_kind)).setup(w)
    assert files(tmp_path / "worker/mnt/opt/ml/input") == {
        "a.csv": "x,y\n1,2\n",
        "deep/b.csv": "x,y\n3,4\n",
    }
    other = AgentSettings(region="paris", regional_datastores=f"nas={nas}")
    with pytest.raises(WorkerFailed, match="this node is in region paris"):
        await InputsStep(lambda w: [], node_staging(other)[0]).setup(w)


async def test_an_output_zip_is_put_into_the_datastores_directory_and_read_back(
    tmp_path: Path, nas: Path
) -> None:
    stores = Datastores({"nas": nas}, "lab")
    zipped = tmp_path / "fit.zip"
    zipped.write_bytes(b"PK" + b"z" * 3000)
    heard: list[Moved] = []
    out = DatastoreRef(datastore="nas", path="/results/run1", region="lab")
    await stores.put(zipped, out, transfer(limit=10, heard=heard))  # a put writes no disk
    assert (nas / "results/run1/fit.zip").read_bytes() == zipped.read_bytes()
    assert heard[-1] == Moved(3002, 3002)
    assert sorted(p.name for p in (nas / "results/run1").iterdir()) == ["fit.zip"]  # no .part
    zipped.write_bytes(b"PK again")
    await stores.put(zipped, out, transfer())  # again: replaced whole
    assert (nas / "results/run1/fit.zip").read_bytes() == b"PK again"
    await stores.put(zipped, DatastoreRef(datastore="nas", path="/"), transfer())
    assert (nas / "fit.zip").read_bytes() == b"PK again"


async def test_an_output_never_goes_outside_the_root(tmp_path: Path, nas: Path) -> None:
    stores = Datastores({"nas": nas}, "lab")
    zipped = tmp_path / "fit.zip"
    zipped.write_bytes(b"PK")
    (nas / "out").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (nas / "file").write_text("x")
    for path, says in (
        ("/out", "cannot put datastore nas:/out/fit.zip: out: a symlink, not followed"),
        ("/out/deeper", "out: a symlink, not followed"),
        ("/file/x", "file: Not a directory"),
        ("/../x", "could resolve outside its root"),
    ):
        with pytest.raises(WorkerFailed, match=re.escape(says)):
            await stores.put(zipped, DatastoreRef(datastore="nas", path=path), transfer())
    assert list((tmp_path / "elsewhere").iterdir()) == []
    with pytest.raises(WorkerFailed, match="this node is in region lab"):
        await stores.put(zipped, DatastoreRef(datastore="nas", path="/r", region="x"), transfer())
    with pytest.raises(WorkerFailed, match="datastore smb is not mounted on this node"):
        await stores.put(zipped, DatastoreRef(datastore="smb", path="/r"), transfer())
