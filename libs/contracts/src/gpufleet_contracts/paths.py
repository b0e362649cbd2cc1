"""Paths inside a root (R-RES-2: nothing may resolve outside a datastore's root; R-JOB-6: a
route's file is inside the model code): decoded first, then checked.

A check on the text as given misses what a later layer decodes: `..%2f`, `%252e%252e` (encoded
twice), the overlong UTF-8 `%c0%ae` for a dot, full-width dots and slashes (U+FF0E, U+FF0F)
that NFKC turns into `../`. `contained_path` therefore percent-decodes and NFKC-normalizes until
the text no longer changes (at most MAX_DECODE_ROUNDS layers), refuses bytes that are not strict
UTF-8 (Python's decoder refuses overlong forms), and checks the result. What it returns is
that canonical form: the text the checks passed is the text that is used, so no layer after
it can decode it into something else.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import unquote_to_bytes

from .fields import describe, refused_char

MAX_DECODE_ROUNDS = 3  # "%25252e" (three layers of encoding) decodes; a fourth is refused
MAX_PATH_CHARS = 1024
_DRIVE = re.compile(r"[A-Za-z]:")  # C:, as an SMB share or a Windows client would read it


class UnsafePath(ValueError):
    """Why a path could resolve outside its root (or is not a path at all)."""


def _decode_once(text: str) -> str:
    try:
        decoded = unquote_to_bytes(text).decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:  # overlong, stray, surrogates
        raise UnsafePath(f"not valid UTF-8 once percent-decoded ({exc.reason})") from exc
    return unicodedata.normalize("NFKC", decoded)


def canonical(path: str) -> str:
    """`path` percent-decoded and NFKC-normalized until stable; UnsafePath if it never is."""
    text = path
    for _ in range(MAX_DECODE_ROUNDS + 1):
        decoded = _decode_once(text)
        if decoded == text:
            return text
        text = decoded
    raise UnsafePath(f"still encoded after {MAX_DECODE_ROUNDS} rounds of decoding")


def contained_path(path: str, *, rooted: bool) -> str:
    """The canonical form of `path`, a path inside some root, or UnsafePath saying why not.

    `rooted`: the path starts with one `/` that stands for the root (a datastore path,
    `/subdir2` of root `/dir2` is `/dir2/subdir2`); otherwise it is relative (a route file).
    Refused, after decoding: control and format characters (NUL included, as for names),
    backslashes, a drive (`C:`), a home (`~`), a second leading slash (`//host/share`), a
    leading slash where none is expected, any `..` segment (or a segment of dots and spaces
    that Windows would read as one, such as `...` or `.. `), and anything that would
    climb out of the root.
    """
    text = canonical(path)
    found = refused_char(text)
    if found is not None:
        raise UnsafePath(f"{describe(found[1])} at position {found[0]}")
    if "\\" in text:
        raise UnsafePath("a backslash (a path separator on SMB shares)")
    if len(text) > MAX_PATH_CHARS:
        raise UnsafePath(f"longer than {MAX_PATH_CHARS} characters once decoded")
    if rooted:
        if not text.startswith("/"):
            raise UnsafePath("not an absolute path inside the root")
        rest = text[1:]
    else:
        rest = text
    if rest.startswith("/"):
        raise UnsafePath("an absolute path" if not rooted else "a path outside the root (//)")
    if rest.startswith("~") or _DRIVE.match(rest):
        raise UnsafePath("a home directory or drive, outside the root")
    # With no `..` left after decoding, no backslash and no leading slash, every segment
    # names something inside the root: nothing else can climb out of it.
    for segment in rest.split("/"):
        if ".." in segment and not segment.strip(". "):
            raise UnsafePath(f"a {segment!r} segment")
    return text


def rooted_join(root: str, path: str) -> str:
    """A datastore's `root` and a request's `path` inside it, as one absolute path (R-RES-2:
    root `/dir2` + request `/subdir2` = `/dir2/subdir2`), or UnsafePath. `path` must pass
    `contained_path` (rooted); `root` is an absolute path that passes it too (a server's
    export or share, or the directory a node mounted it at). The result never leaves `root`:
    it is `root` itself or `root` + `/` + the checked path's segments."""
    base = contained_path(root, rooted=True).rstrip("/")
    inside = contained_path(path, rooted=True).strip("/")
    segments = [s for s in inside.split("/") if s not in ("", ".")]
    if not segments:
        return base or "/"
    return f"{base}/{'/'.join(segments)}"
