"""A job's packages are data (R-JOB-7, package_entries.py): names with version specifiers in
each kind's grammar; a URL, a local path or an installer option is refused at submission,
naming the field (with the entry's index), the rule and what would be valid."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts import field_errors
from gpufleet_contracts.jobs import SubmitJob
from gpufleet_contracts.jobspec import Packages
from pydantic import ValidationError

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {"name": "pkgs", "gpu_types": ["RTX 3090"], "command": ["true"]}
SHA = "0" * 64


def refused(kind: str, entry: str) -> tuple[str, str, str, str | None]:
    """(field, rule, message, valid) of the one refusal of `entry` as the 2nd of `kind`."""
    packages = {kind: ["ok-entry" if kind != "requirements" else "", entry]}
    if kind == "apt":
        packages[kind][0] = "curl"
    with pytest.raises(ValidationError) as info:
        SubmitJob.model_validate({"spec": {**BASE, "environment": {"packages": packages}}})
    (err,) = field_errors(info.value)
    return err.field, err.rule, err.message, err.valid


def accepted(kind: str, entry: str) -> bool:
    spec = {**BASE, "environment": {"packages": {kind: [entry]}}}
    return getattr(SubmitJob.model_validate({"spec": spec}).spec.environment.packages, kind) == [
        entry
    ]


@pytest.mark.parametrize(
    ("kind", "entry", "why"),
    [
        # direct URLs and VCS (PEP 508 `name @ url`, pip's bare URLs)
        ("pip", "pkg @ file:///etc/passwd", "a direct URL (name @ URL)"),
        ("pip", "pkg@https://evil.example/pkg-1.0.whl", "a direct URL (name @ URL)"),
        ("pip", "git+https://evil.example/x.git", "a URL is not a package"),
        ("pip", "https://evil.example/x-1.0.tar.gz", "a URL is not a package"),
        ("requirements", "pkg @ git+ssh://git@evil.example/x.git", "a direct URL"),
        # local paths and files
        ("pip", "./src", "a local path or file"),
        ("pip", "/tmp/x-1.0-py3-none-any.whl", "a local path or file"),
        ("pip", "..", "a local path or file"),
        ("pip", "x-1.0.tar.gz", "a local path or file"),
        # installer options, alone or after a requirement
        ("pip", "--index-url=http://evil.example/simple", "an installer option (--index-url)"),
        ("pip", "numpy --config-settings=editable_mode=compat", "(--config-settings)"),
        ("requirements", "-r other.txt", "an installer option (-r)"),
        ("requirements", "-c constraints.txt", "an installer option (-c)"),
        ("requirements", "-e .", "an installer option (-e)"),
        ("requirements", "--extra-index-url http://evil.example", "(--extra-index-url)"),
        ("requirements", "--find-links http://evil.example", "(--find-links)"),
        ("requirements", "numpy --global-option=build_ext", "(--global-option)"),
        ("requirements", "numpy==1.26 --hash=md5:0123", "not a sha256, sha384 or sha512"),
        # what a shell or pip would expand
        ("pip", "numpy$(id)", "'$' has no place"),
        ("pip", "numpy`id`", "'`' has no place"),
        ("requirements", "${PIP_INDEX_URL}", "'$'"),
        ("requirements", "numpy \\", "a backslash"),
        ("pip", "foo===anything", "arbitrary equality"),
        ("pip", "numpy>", "not a PEP 508 requirement"),
        # apt: Debian names, no .deb file, no option, no pattern
        ("apt", "./evil.deb", "a local path or file"),
        ("apt", "http://evil.example/x.deb", "a URL is not a package"),
        (
            "apt",
            "-oAPT::Get::AllowUnauthenticated=1",
            "an installer option (-oAPT::Get::AllowUnauthenticated",
        ),
        ("apt", "curl*", "not a Debian package name"),
        ("apt", "Curl", "not a Debian package name"),
        ("apt", "curl$(id)", "not a Debian package name"),
        # conda: no channel, no bracketed key, no URL or file
        ("conda", "evil-channel::numpy", "a channel"),
        ("conda", "numpy[channel=evil]", "a bracketed key"),
        ("conda", "https://evil.example/numpy-1.0.conda", "a URL is not a package"),
        ("conda", "numpy-1.26-0.tar.bz2", "a local path or file"),
        ("conda", "--channel=evil", "an installer option (--channel)"),
    ],
)
def test_a_url_a_path_or_an_option_is_refused_naming_the_field(
    kind: str, entry: str, why: str
) -> None:
    field, rule, message, valid = refused(kind, entry)
    assert field == f"spec.environment.packages.{kind}.1"
    assert rule == "R-JOB-7"
    assert message.startswith(f"{entry}: ") and why in message, message
    assert valid is not None and "e.g." in valid


@pytest.mark.parametrize(
    ("kind", "entry"),
    [
        ("pip", "numpy"),
        ("pip", "numpy==1.26.4"),
        ("pip", "numpy>=1.26,<2"),  # < and >: version specifiers
        ("pip", "foo (>=1.0)"),  # ( and ): PEP 508's older form
        ("pip", "uvicorn[standard]>=0.20"),
        ("pip", "torch==2.3.0+cpu"),
        ("pip", "numpy==1.*"),
        ("pip", "pywin32; sys_platform == 'win32'"),  # markers: data pip evaluates
        ("requirements", ""),
        ("requirements", "# pinned for the paper"),
        ("requirements", "numpy==1.26.4  # pinned"),
        ("requirements", f"numpy==1.26.4 --hash=sha256:{SHA} --hash=sha256:{SHA}"),
        ("apt", "curl"),
        ("apt", "g++"),
        ("apt", "libssl3=3.0.11-1~deb12u2"),
        ("apt", "libc6:amd64"),
        ("apt", "curl/bookworm-backports"),
        ("conda", "numpy"),
        ("conda", "numpy=1.26"),
        ("conda", "numpy>=1.26,<2"),
        ("conda", "numpy 1.26.*"),
        ("conda", "numpy=1.26=py311_0"),
    ],
)
def test_names_with_version_specs_are_accepted(kind: str, entry: str) -> None:
    assert accepted(kind, entry)


def test_every_bad_entry_is_named_by_its_index() -> None:
    with pytest.raises(ValidationError) as info:
        Packages(pip=["numpy", "a @ file:///x", "b"], apt=["-y"], requirements=["-r x"])
    assert sorted(".".join(map(str, e["loc"])) for e in info.value.errors()) == [
        "apt.0",
        "pip.1",
        "requirements.0",
    ]
