"""A datastore's root and a request's path, joined by one function (R-RES-2): `/dir2` +
`/subdir2` = `/dir2/subdir2`, and nothing it returns is outside the root, whatever the
request holds (a property over hostile paths)."""

from __future__ import annotations

import posixpath

import pytest
from gpufleet_contracts.paths import UnsafePath, rooted_join
from hypothesis import given, settings
from hypothesis import strategies as st

from .test_paths import OUTSIDE_DATASTORE

ROOTS = ["/dir2", "/", "/share/a b", "/export/data/"]
# pieces an attacker strings together: separators, dots, encodings, Unicode look-alikes
HOSTILE = st.lists(
    st.sampled_from(
        [
            "/",
            "..",
            ".",
            "%2e",
            "%2f",
            "%252e",
            "%c0%ae",
            "\uff0e",
            "\uff0f",
            "\\",
            "%5c",
            "~",
            "C:",
            "\x00",
            "%00",
            " ",
            "a",
            "b",
            "dir",
            "%",
            "%25",
            "\u202e",
            ":",
            "//",
        ]
    ),
    max_size=12,
).map("".join)


def test_the_root_and_the_request_are_one_path() -> None:
    assert rooted_join("/dir2", "/subdir2") == "/dir2/subdir2"
    assert rooted_join("/dir2/", "/a/./b/") == "/dir2/a/b"
    assert rooted_join("/dir2", "/") == "/dir2"
    assert rooted_join("/", "/x") == "/x"


@pytest.mark.parametrize("path", OUTSIDE_DATASTORE.values(), ids=OUTSIDE_DATASTORE.keys())
def test_a_path_that_could_leave_the_root_is_refused(path: str) -> None:
    with pytest.raises(UnsafePath):
        rooted_join("/dir2", path)


@pytest.mark.parametrize("root", ["dir2", "/a/../b", "//host/share", "/a\x00"])
def test_a_root_that_is_not_a_plain_absolute_path_is_refused(root: str) -> None:
    with pytest.raises(UnsafePath):
        rooted_join(root, "/x")


@settings(max_examples=400, deadline=None)
@given(root=st.sampled_from(ROOTS), tail=HOSTILE, prefix=st.sampled_from(["/", "", "/a/"]))
def test_whatever_the_request_the_result_is_inside_the_root(
    root: str, tail: str, prefix: str
) -> None:
    try:
        joined = rooted_join(root, prefix + tail)
    except UnsafePath:
        return
    base = root.rstrip("/") or "/"
    # the text as returned, normalized as a kernel would walk it, stays under the root
    assert posixpath.normpath(joined) == joined
    assert posixpath.commonpath([base, joined]) == base
    assert "\x00" not in joined and "\\" not in joined and ".." not in joined.split("/")
