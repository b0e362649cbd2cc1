"""Paths inside a root (R-RES-2, R-JOB-6): decoded (percent, repeatedly; strict UTF-8; NFKC)
before they are checked, and kept in the canonical form that was checked."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts import field_errors
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from gpufleet_contracts.paths import MAX_DECODE_ROUNDS, UnsafePath, canonical, contained_path
from pydantic import ValidationError

OUTSIDE_DATASTORE = {
    "encoded slashes": "/a/..%2f..%2fetc/passwd",
    "encoded dots": "/a/%2e%2e/%2e%2e/etc",
    "double-encoded dots": "/%252e%252e/%252e%252e/etc",
    "triple-encoded dots": "/%25252e%25252e/etc",
    "overlong UTF-8 dot": "/%c0%ae%c0%ae/etc",
    "overlong UTF-8 slash": "/..%c0%af..%c0%afetc",
    "full-width dots": "/\uff0e\uff0e/etc",
    "full-width dots and slash": "/a\uff0f\uff0e\uff0e\uff0f\uff0e\uff0e\uff0fetc",
    "full-width percent": "/\uff052e\uff052e/etc",
    "plain ..": "/a/../../etc",
    "three dots": "/a/.../etc",
    "dots and a space": "/a/.. /etc",
    "NUL": "/a\x00b",
    "encoded NUL": "/a%00b",
    "ESC": "/a\x1b[2Jb",
    "right-to-left override": "/a\u202eyp.exe",
    "backslash": "/a\\..\\..\\etc",
    "encoded backslash": "/a%5c..%5cetc",
    "network path": "//host/share",
    "encoded second slash": "/%2fhost/share",
    "drive": "/C:/Windows",
    "home": "/~root/.ssh",
    "not absolute": "a/b",
    "invalid UTF-8": "/%ff%fe",
}
INSIDE_DATASTORE = {
    "/": "/",
    "/sub": "/sub",
    "/dir2/subdir2": "/dir2/subdir2",
    "/data/PASCAL VOC/2012": "/data/PASCAL VOC/2012",
    "/a/..b/c../.d": "/a/..b/c../.d",
    "/a/./b": "/a/./b",
    "/données/été": "/données/été",
    "/data/100%": "/data/100%",  # not an escape: kept as it is
    "/data/a%20b": "/data/a b",  # decoded: what was checked is what is used
    "/data/%E2%82%AC": "/data/€",
    "/data/\ufb01le": "/data/file",  # NFKC: the ligature fi is two letters
}


@pytest.mark.parametrize("path", OUTSIDE_DATASTORE.values(), ids=OUTSIDE_DATASTORE.keys())
def test_datastore_paths_that_could_leave_the_root_are_refused(path: str) -> None:
    with pytest.raises(UnsafePath):
        contained_path(path, rooted=True)


@pytest.mark.parametrize(("path", "kept"), INSIDE_DATASTORE.items())
def test_datastore_paths_inside_the_root_pass_in_canonical_form(path: str, kept: str) -> None:
    assert contained_path(path, rooted=True) == kept


@pytest.mark.parametrize(
    "file",
    [
        "%2e%2e/evil.py",
        "..%2fevil.py",
        "%252e%252e/evil.py",
        "%c0%ae%c0%ae/evil.py",
        "\uff0e\uff0e/evil.py",
        "\uff0e\uff0e\uff0fevil.py",
        "/etc/evil.py",
        "%2fetc/evil.py",
        "~/evil.py",
        "a/../../evil.py",
        "a\\evil.py",
        "C:evil.py",
    ],
)
def test_route_files_that_could_leave_the_model_code_are_refused(file: str) -> None:
    with pytest.raises(UnsafePath):
        contained_path(file, rooted=False)


def test_decoding_is_bounded() -> None:
    dots = "%2e"
    for _ in range(MAX_DECODE_ROUNDS - 1):
        dots = dots.replace("%", "%25")
    assert canonical(dots) == "."  # three layers of encoding decode...
    with pytest.raises(UnsafePath, match="still encoded"):
        canonical(dots.replace("%", "%25"))  # ...a fourth is refused
    with pytest.raises(UnsafePath, match="UTF-8"):
        canonical("a%c0%ae")


# --- where the spec takes such paths ---------------------------------------------------------

BASE: dict[str, Any] = {"name": "hello", "gpu_types": ["RTX 3090"], "command": ["true"]}
DATASTORE = {"type": "regional_datastore", "datastore": "nas", "region": "r1"}
MODEL = {"source": "git", "path": "https://github.com/me/m.git"}


def refused(**spec: Any) -> dict[str, str]:
    with pytest.raises(ValidationError) as info:
        SubmitJob.model_validate({"spec": {**BASE, **spec}})
    return {e.field: e.rule for e in field_errors(info.value)}


@pytest.mark.parametrize("path", OUTSIDE_DATASTORE.values(), ids=OUTSIDE_DATASTORE.keys())
def test_the_spec_refuses_them_for_output_and_input_data(path: str) -> None:
    if path == "a/b":  # no leading /: refused by the type's path form (R-JOB-3)
        assert refused(output_data={**DATASTORE, "path": path})["spec.output_data"] == "R-JOB-3"
        return
    assert refused(output_data={**DATASTORE, "path": path})["spec.output_data.path"] == "R-RES-2"
    got = refused(type="inference", input_data={**DATASTORE, "path": path})
    assert got["spec.input_data.path"] == "R-RES-2"


def test_the_spec_keeps_the_canonical_path() -> None:
    spec = JobSpec.model_validate({**BASE, "output_data": {**DATASTORE, "path": "/a%20b/\uff43"}})
    assert spec.output_data is not None and spec.output_data.path == "/a b/c"


def test_the_spec_refuses_route_files_outside_the_model_code_and_keeps_good_ones() -> None:
    def endpoint(file: str) -> dict[str, Any]:
        route = {"path": "/p", "file": file, "function": "f"}
        return {"type": "endpoint", "command": [], "model": MODEL, "endpoint": {"routes": [route]}}

    assert refused(**endpoint("%2e%2e/evil.py"))["spec.endpoint.routes.0.file"] == "R-JOB-6"
    assert refused(**endpoint("$HOME/x.py"))["spec.endpoint.routes.0.file"] == "R-JOB-6"
    assert refused(**endpoint("app/x.txt"))["spec.endpoint.routes.0.file"] == "R-JOB-6"
    spec = JobSpec.model_validate({**BASE, **endpoint("app/%70redict.py")})
    assert spec.endpoint is not None and spec.endpoint.routes[0].file == "app/predict.py"
