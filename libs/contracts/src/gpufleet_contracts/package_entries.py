"""A job's package entries (R-JOB-7) as data: names with version specifiers, never a source.

An entry names what to install, never where from or how: no URL, no local path, no installer
option. The sources are the node operator's (pip's index, `GPUFLEET_PACKAGE_INDEX_URL`; the
image's apt sources and conda channels), and the node agent builds with the network only to
reach them (services/node-agent/README.md, "Base environments and packages"). Each kind has
its grammar:

- `pip`: a PEP 508 requirement without a URL (`name @ url`): a name, extras, version
  specifiers (PEP 440 versions; not `===`, which takes any string) and environment markers,
  read by the `packaging` library as pip reads it, in the characters `PIP_CHARS` allows (no
  `$`: pip expands `${VAR}` in requirements files; no `/`, `:`, `@`, `#`, `\\`).
- `requirements`: a line of a requirements.txt: blank, a `# comment`, or a `pip` entry
  followed by `--hash=<sha256|sha384|sha512>:<hex>` options (they only narrow what pip
  accepts) and a ` # comment`. No other option: `-r`, `-c`, `-e`, `--index-url`,
  `--extra-index-url`, `--find-links`, `--config-settings`, `--global-option`, ... name
  another source or run other code.
- `apt`: a Debian package name (Debian policy: `[a-z0-9][a-z0-9+.-]+`), then optionally
  `:arch`, and `=version` or `/release`; no `.deb` file, no pattern.
- `conda`: a conda match spec of a name and a version spec (`numpy`, `numpy>=1.26,<2`,
  `numpy 1.26.*`, `numpy=1.26=py311_0`); no channel (`conda-forge::numpy`), no `[key=...]`
  (which may name a channel or a URL), no URL or package file.

Each problem is a sentence naming what the entry is instead (`problem`); `jobspec.Packages`
turns it into a refusal naming the field, the entry and rule R-JOB-7.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from packaging.requirements import InvalidRequirement, Requirement

PIP_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ._-[],<>=!~*;()\"'+"
)
HASH_ALGORITHMS = {"sha256": 64, "sha384": 96, "sha512": 128}  # name -> hex digits

APT_NAME = r"[a-z0-9][a-z0-9+.-]+"
APT_ENTRY = re.compile(
    rf"(?P<name>{APT_NAME})(?::[a-z0-9][a-z0-9-]*)?(?:=[0-9][A-Za-z0-9.+~:-]*|/[a-z0-9][a-z0-9.+-]*)?"
)

CONDA_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_CONDA_VERSION = r"[A-Za-z0-9_.*+!]+"
_CONDA_CONSTRAINT = rf"(?:==|!=|>=|<=|~=|>|<|=)?{_CONDA_VERSION}"
_CONDA_SPEC = rf"{_CONDA_CONSTRAINT}(?:[,|]{_CONDA_CONSTRAINT})*"
CONDA_ENTRY = re.compile(
    rf"(?P<name>{CONDA_NAME})"
    rf"(?:(?:\s+(?={_CONDA_SPEC})|(?=[=<>!~])){_CONDA_SPEC}(?:[=\s][A-Za-z0-9_.*+]+)?)?"
)
CONDA_FILES = (".tar.bz2", ".conda")
FROM_THE_NODE = "packages come from the node operator's sources (pip's index, apt, conda)"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|^(?:git|hg|svn|bzr)\+|^git@")
_PATH = re.compile(r"^(?:\.{1,2}(?:/|$)|/|~)|\.(?:whl|tar\.gz|tar\.bz2|zip|deb|conda)$")
_COMMENT = re.compile(r"(?:^|\s+)#.*$")  # pip's: a `#` at the start or after whitespace
_HASH = re.compile(r"\s+--hash[=\s](?P<alg>[a-z0-9]+):(?P<hex>[0-9a-f]+)$")


def _source(entry: str, release: bool = False) -> str | None:
    """What an entry that names a source instead of a package is, or None (`release`: a
    `/` may select a release, as apt's `name/release` does)."""
    text = entry.strip()
    if text.startswith("-"):
        option = text.split()[0].split("=")[0]
        return f"an installer option ({option}) is not a package"
    if "\\" in text:
        return "a backslash (a line continuation or a Windows path) is not part of a package"
    if re.search(r"\s@|@\s", text) or ("@" in text and "://" in text):
        return f"a direct URL (name @ URL) is not a package: {FROM_THE_NODE}"
    if "://" in text or _URL.search(text):
        return f"a URL is not a package: {FROM_THE_NODE}"
    if _PATH.search(text) or (not release and "/" in text):
        return f"a local path or file is not a package: {FROM_THE_NODE}"
    return None


def pip_problem(entry: str) -> str | None:
    """Why `entry` is not a pip requirement as R-JOB-7 allows, or None."""
    found = _source(entry)
    if found is not None:
        return found
    bad_chars = sorted({c for c in entry if c not in PIP_CHARS})
    if bad_chars:
        if "@" in bad_chars:
            return "a direct URL (name @ URL) is not a package"
        shown = " ".join(repr(c) for c in bad_chars)
        return f"{shown} has no place in a PEP 508 requirement without a URL"
    option = re.search(r"(?:^|\s)(-{1,2}[A-Za-z][A-Za-z0-9-]*)", entry)
    if option is not None:
        return f"an installer option ({option.group(1)}) is not a package"
    try:
        req = Requirement(entry)
    except InvalidRequirement as exc:
        return f"not a PEP 508 requirement: {str(exc).splitlines()[0]}"
    if req.url:
        return "a direct URL (name @ URL) is not a package"
    if any(s.operator == "===" for s in req.specifier):
        return "arbitrary equality (===) compares any string; use == with a PEP 440 version"
    return None


def requirements_problem(line: str) -> str | None:
    """Why `line` is not a requirements.txt line as R-JOB-7 allows, or None."""
    if not line.strip():
        return None
    if line.lstrip().startswith("#"):
        return "a comment may not end with a backslash" if line.endswith("\\") else None
    text = _COMMENT.sub("", line)
    while (hashed := _HASH.search(text)) is not None:
        alg, digest = hashed.group("alg"), hashed.group("hex")
        if HASH_ALGORITHMS.get(alg) != len(digest):
            return f"--hash={alg}:... is not a sha256, sha384 or sha512 digest in hex"
        text = text[: hashed.start()]
    return pip_problem(text.rstrip())


def apt_problem(entry: str) -> str | None:
    """Why `entry` is not an apt package as R-JOB-7 allows, or None."""
    found = _source(entry, release=True)
    if found is not None:
        return found
    if APT_ENTRY.fullmatch(entry) is None:
        return (
            "not a Debian package name ([a-z0-9][a-z0-9+.-]+, optionally :arch, "
            "=version or /release)"
        )
    return None


def conda_problem(entry: str) -> str | None:
    """Why `entry` is not a conda match spec as R-JOB-7 allows, or None."""
    found = _source(entry)
    if found is not None:
        return found
    if "::" in entry:
        return "a channel (channel::name) is not the job's to choose: the image's channels are used"
    if "[" in entry:
        return (
            "a bracketed key ([channel=...], [url=...]) is not allowed: a name and a version spec"
        )
    if entry.endswith(CONDA_FILES):
        return f"a package file is not a package: {FROM_THE_NODE}"
    if CONDA_ENTRY.fullmatch(entry) is None:
        return "not a conda package name with a version spec (e.g. numpy>=1.26,<2)"
    return None


PROBLEMS: dict[str, Callable[[str], str | None]] = {
    "apt": apt_problem,
    "conda": conda_problem,
    "requirements": requirements_problem,
    "pip": pip_problem,
}
VALID = {
    "apt": "a Debian package name, optionally :arch and =version or /release, e.g. curl",
    "conda": "a conda package name and version spec, e.g. numpy>=1.26,<2 (no channel, URL or file)",
    "requirements": (
        "a PEP 508 requirement without a URL, e.g. numpy>=1.26,<2, optionally with "
        "--hash=sha256:<hex>; a blank line or a # comment"
    ),
    "pip": "a PEP 508 requirement without a URL: name, extras, version specifiers, markers, "
    "e.g. numpy>=1.26,<2",
}
