"""A job's packages (R-JOB-7) as plain data: the plan's order, the build script, the cache
key and a failed build's reason."""

from __future__ import annotations

import subprocess

import pytest
from gpufleet_contracts.jobspec import Packages
from gpufleet_node_agent.builds import BUILD_CAPS, BuildConfig, build_argv, commit_argv
from gpufleet_node_agent.packages import (
    MARKER,
    NO_CONDA,
    Step,
    UnsafeRequirement,
    build_key,
    failed_step,
    failure_reason,
    index_env,
    model_requirements,
    package_tag,
    plan,
    script,
)
from pydantic import ValidationError

pytestmark = pytest.mark.unit


def test_the_plan_follows_apt_conda_requirements_pip_whatever_the_spec_order() -> None:
    spec = {"pip": ["b==2"], "requirements": ["r1", "r2"], "conda": ["c"], "apt": ["a"]}
    steps = plan(spec)
    assert [s.kind for s in steps] == ["apt", "conda", "requirements", "pip"]
    assert [s.name for s in steps] == ["apt", "conda", "requirements.txt", "pip"]
    assert steps[2].items == ("r1", "r2")
    assert tuple(s.name for s in steps) == Packages.INSTALL_ORDER
    assert [s.kind for s in plan({"pip": ["x"], "apt": ["y"]})] == ["apt", "pip"]
    assert plan({}) == plan(None) == plan(Packages().model_dump()) == ()
    # requirements.txt's blank lines and comments are no requirement (no step of their own)
    assert plan({"requirements": ["", "# pinned", "r1  # why"]})[0].items == ("r1  # why",)
    assert plan({"requirements": ["# only a comment", ""]}) == ()


def test_the_script_runs_the_steps_in_order_each_after_its_marker() -> None:
    steps = plan({"pip": ["tiny==1.0"], "requirements": ["req-a>=1"], "apt": ["hello"]})
    text = script(steps)
    at = [text.index(f"echo '{MARKER}{name}'") for name in ("apt", "requirements.txt", "pip")]
    assert at == sorted(at)
    assert text.index("apt-get install -y -q --no-install-recommends hello") > at[0]
    assert text.index("-m pip install -r /tmp/gpufleet-requirements.txt") > at[1]
    assert text.index("\nreq-a>=1\n") > at[1]
    assert text.index("-m pip install tiny==1.0") > at[2]
    assert text.rstrip().endswith(f"echo '{MARKER}done'")
    subprocess.run(["sh", "-n"], input=text, text=True, check=True)  # valid POSIX sh


def test_packages_are_single_quoted_words_and_options_are_refused() -> None:
    text = script((Step("pip", ("uvicorn[standard]", "a$(touch x)")),))
    assert "'uvicorn[standard]' 'a$(touch x)'" in text
    for bad in (["--index-url=http://elsewhere"], ["-e ."], ["a;b"]):
        with pytest.raises(ValidationError) as exc:
            Packages(pip=bad)
        error = exc.value.errors()[0]
        assert error["loc"] == ("pip", 0) and error["ctx"]["rule"] == "R-JOB-7"
        assert error["msg"].startswith(f"{bad[0]}: ")  # then why (package_entries.py)
    with pytest.raises(ValidationError):
        Packages(pip=["x\ny"])
    with pytest.raises(ValidationError):
        Packages(requirements=["--extra-index-url http://elsewhere"])


def test_conda_without_conda_in_the_image_fails_with_a_clear_reason() -> None:
    text = script(plan({"conda": ["numpy"]}))
    assert "micromamba install -y -n base numpy" in text
    assert f"gpufleet_fail '{NO_CONDA}'" in text


def test_a_framework_is_installed_from_wheels_only() -> None:
    assert "-m pip install --only-binary :all: torch==2.3" in script(
        (Step("pip", ("torch==2.3",), binary_only=True),)
    )


def test_the_index_is_the_operators_and_plain_http_is_trusted_by_name() -> None:
    assert index_env(None) == {}
    assert index_env("https://pypi.example/simple") == {
        "PIP_INDEX_URL": "https://pypi.example/simple"
    }
    assert index_env("http://10.0.0.5:8080/simple") == {
        "PIP_INDEX_URL": "http://10.0.0.5:8080/simple",
        "PIP_TRUSTED_HOST": "10.0.0.5",
    }
    assert "export PIP_INDEX_URL=http://10.0.0.5:8080/simple" in script(
        plan({"pip": ["x"]}), "http://10.0.0.5:8080/simple"
    )


def test_the_cache_key_is_the_image_id_the_steps_the_index_and_the_owner() -> None:
    steps = plan({"pip": ["x"]})
    key = build_key("sha256:aa", steps, None, "acme")
    assert key == build_key("sha256:aa", plan({"pip": ["x"]}), None, "acme")
    others = {
        build_key("sha256:bb", steps, None, "acme"),
        build_key("sha256:aa", plan({"pip": ["y"]}), None, "acme"),
        build_key("sha256:aa", plan({"requirements": ["x"]}), None, "acme"),
        build_key("sha256:aa", steps, "http://i/simple", "acme"),
        build_key("sha256:aa", steps, None, "other"),
    }
    assert key not in others and len(others) == 5
    assert package_tag(key) == f"localhost/gpufleet/pkgs:{key[:24]}"


def test_a_failed_build_names_its_step_and_the_tail_of_its_output() -> None:
    out = f"{MARKER}apt\nok\n{MARKER}pip\nERROR: No matching distribution found for nope\n"
    assert failed_step(out) == "pip"
    reason = failure_reason(out, 1)
    assert reason.startswith("package step pip failed (exit 1): ")
    assert reason.endswith("No matching distribution found for nope")
    assert failure_reason("x" * 5000, 2).endswith("x" * 800)
    assert failure_reason("", None, 60).startswith("package step setup did not finish in 60 s")


def test_the_build_container_is_root_with_few_capabilities_and_no_host() -> None:
    argv = build_argv("b1", "localhost/img:1", plan({"pip": ["x"]}), BuildConfig())
    joined = " ".join(argv)
    assert argv[0] == "create"  # started once its network is confined (test_buildnet.py)
    assert argv[argv.index("--network") + 1] == "slirp4netns:allow_host_loopback=false"
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--cap-add") + 1].split(",") == list(BUILD_CAPS)
    assert "SYS_ADMIN" not in joined and "NET_RAW" not in joined
    assert "--volume" not in argv and "--device" not in argv and "--privileged" not in argv
    assert argv[argv.index("--security-opt") : argv.index("--security-opt") + 2] == [
        "--security-opt",
        "no-new-privileges",
    ]
    assert argv[argv.index("--entrypoint") + 1 :][:3] == ["/bin/sh", "localhost/img:1", "-c"]


def test_the_commit_gives_the_image_its_entrypoint_and_cmd_back() -> None:
    argv = commit_argv("b1", "localhost/gpufleet/pkgs:abc", {"Entrypoint": ["/e"], "Cmd": None})
    assert argv == [
        "commit",
        "--quiet",
        "--change",
        'ENTRYPOINT ["/e"]',
        "--change",
        "CMD []",
        "b1",
        "localhost/gpufleet/pkgs:abc",
    ]


def test_a_requirements_txt_of_the_model_code_takes_the_requirements_txt_place() -> None:
    """R-JOB-7's order with a requirements.txt found in the model code: apt, conda, that
    file, the spec's requirements lines, pip (the model code staging finds and reads it)."""
    found = model_requirements(
        "/opt/ml/models/requirements.txt", "# the model's\nnumpy>=1.26\n\nscipy==1.13  # pinned\n"
    )
    assert found.lines == ("# the model's", "numpy>=1.26", "", "scipy==1.13  # pinned")
    spec = {"pip": ["b==2"], "requirements": ["r1"], "apt": ["a"]}
    steps = plan(spec, found)
    assert [s.name for s in steps] == [
        "apt",
        "requirements.txt (/opt/ml/models/requirements.txt)",
        "requirements.txt",
        "pip",
    ]
    assert steps[1].items == ("numpy>=1.26", "scipy==1.13  # pinned")
    assert plan(spec, None) == plan(spec)
    assert [s.name for s in plan({}, found)] == [steps[1].name]
    assert plan({}, model_requirements("/opt/ml/models/requirements.txt", "# nothing\n")) == ()
    text = script(plan({}, found))
    assert f"echo '{MARKER}requirements.txt (/opt/ml/models/requirements.txt)'" in text
    subprocess.run(["sh", "-n"], input=text, text=True, check=True)
    out = f"{MARKER}requirements.txt (/opt/ml/models/requirements.txt)\nERROR: no numpy\n"
    assert failure_reason(out, 1).startswith(
        "package step requirements.txt (/opt/ml/models/requirements.txt) failed (exit 1)"
    )


def test_a_model_requirements_line_is_held_to_the_specs_rules() -> None:
    """What the contract refuses in `packages.requirements` at submission, a model's file
    may not bring in either: the worker fails naming the line."""
    for line in (
        "-e .",
        "--index-url http://elsewhere/simple",
        "pkg @ https://x/p.whl",
        "-r b.txt",
    ):
        with pytest.raises(UnsafeRequirement) as exc:
            model_requirements("/opt/ml/models/requirements.txt", f"numpy\n{line}\n")
        assert exc.value.number == 2 and exc.value.line == line
        assert exc.value.reason.startswith("/opt/ml/models/requirements.txt line 2: ")
    with pytest.raises(UnsafeRequirement, match="longer than 256"):
        model_requirements("/r.txt", "a" * 300)
    with pytest.raises(UnsafeRequirement, match="U\\+001B"):
        model_requirements("/r.txt", "numpy # \x1b[2J")
