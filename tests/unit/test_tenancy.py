"""Tenancy rules on plain data (R-TEN-1..3): how a job names its project, who sees a job,
what a project shows to whom, which parts of a spec are regional resources and the plan
they need; and the `gpufleet project` commands (no NATS)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_cli import client
from gpufleet_cli.main import app
from gpufleet_contracts import field_errors
from gpufleet_contracts.identity import Plan
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from gpufleet_contracts.projects import (
    AddProjectMember,
    CreateProject,
    ListProjects,
    ProjectRef,
    RemoveProjectMember,
    parse_project,
)
from gpufleet_contracts.subjects import as_account
from gpufleet_scheduler import jobdoc, tenancy
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

BASE: dict[str, Any] = {"name": "hello", "gpu_types": ["RTX 3090"], "command": ["true"]}


def refusals(model: type[BaseModel], data: dict[str, Any]) -> dict[str, tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        model.model_validate_json(json.dumps(data))
    return {e.field: (e.rule, e.message) for e in field_errors(info.value, model)}


# --- a job's project ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [
        ("default", ProjectRef(None, "default")),
        ("PASCAL VOC", ProjectRef(None, "PASCAL VOC")),
        ("acme/research", ProjectRef("acme", "research")),
        ("acme-2_x/big model", ProjectRef("acme-2_x", "big model")),
        ("a/" + "n" * 64, ProjectRef("a", "n" * 64)),
    ],
)
def test_a_project_is_a_name_or_owner_slash_name(ref: str, parsed: ProjectRef) -> None:
    assert parse_project(ref) == parsed
    assert JobSpec.model_validate({**BASE, "project": ref}).project == ref


def test_a_reference_names_the_same_project_for_everyone() -> None:
    assert parse_project("research").id_for("acme") == "acme/research"
    assert parse_project("acme/research").id_for("bob") == "acme/research"
    assert parse_project("acme/research").owner_for("bob") == "acme"


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("a/b/c", "more than one '/'"),
        ("ac me/x", "'ac me' (before the '/') is not an account name"),
        ("/x", "is not an account name"),
        ("acme/", "'acme/' has an empty name"),
        ("acme/ x", "leading or trailing whitespace"),
        ("n" * 65, "at most 64 characters, got 65"),
        ("acme/" + "n" * 65, "at most 64 characters"),
    ],
)
def test_malformed_project_references_are_refused_under_r_ten_1(ref: str, says: str) -> None:
    rule, message = refusals(SubmitJob, {"spec": {**BASE, "project": ref}})["spec.project"]
    assert rule == "R-TEN-1"
    assert says in message
    assert "{" not in message  # every placeholder filled


@pytest.mark.parametrize("ref", ["acme/re\x00search", "acme\x1b/x", "acme/x\u202e", "x\n"])
def test_control_and_format_characters_stay_refused_in_either_form(ref: str) -> None:
    rule, _ = refusals(SubmitJob, {"spec": {**BASE, "project": ref}})["spec.project"]
    assert rule == "schema:name_chars"


def test_project_requests_validate_their_fields() -> None:
    assert CreateProject.model_validate({"name": "research"}).name == "research"
    rule, message = refusals(CreateProject, {"name": "acme/research"})["name"]
    assert rule == "R-TEN-1" and "no '/'" in message
    assert refusals(CreateProject, {"name": "x\u200b"})["name"][0] == "schema:name_chars"
    ok = AddProjectMember.model_validate({"project": "acme/research", "account": "bob"})
    assert ok.account == "bob"
    assert "account" in refusals(AddProjectMember, {"project": "p", "account": "bob.x"})
    assert "account" in refusals(RemoveProjectMember, {"project": "p", "account": "*"})
    assert "limit" in refusals(ListProjects, {"limit": 0})
    assert ListProjects().limit == 100


def test_a_job_document_is_owned_by_the_project_owner_and_created_by_the_sender() -> None:
    spec = JobSpec.model_validate({**BASE, "project": "acme/research"})
    now = datetime.now(UTC)
    doc = jobdoc.new_job("j1", spec, "bob", now, None, owner="acme", project="research")
    assert (doc["owner"], doc["creator"], doc["project"]) == ("acme", "bob", "research")
    assert doc["req"]["project"] == "research"
    assert doc["spec"]["project"] == "acme/research"  # the spec as it was sent
    plain = jobdoc.new_job("j2", JobSpec.model_validate(BASE), "bob", now, None)
    assert (plain["owner"], plain["creator"], plain["project"]) == ("bob", "bob", "default")


# --- who sees a job ----------------------------------------------------------------------


def test_a_job_is_visible_to_its_owner_and_its_creator_only() -> None:
    job = {"owner": "acme", "creator": "bob"}
    assert tenancy.may_see(job, "acme")
    assert tenancy.may_see(job, "bob")
    assert not tenancy.may_see(job, "carol")  # another member of the project, say
    assert tenancy.visible_to("carol") == {"$or": [{"owner": "carol"}, {"creator": "carol"}]}


def test_a_project_shows_its_members_to_its_owner_only() -> None:
    doc = {"_id": "acme/r", "owner": "acme", "name": "r", "members": ["carol", "bob"]}
    mine = tenancy.project_view({**doc, "created_ms": 0}, "acme")
    assert mine["members"] == ["bob", "carol"] and mine["role"] == "owner"
    assert mine["created_at"] == "1970-01-01T00:00:00+00:00"
    theirs = tenancy.project_view(doc, "bob")
    assert theirs["role"] == "member" and "members" not in theirs
    assert theirs["id"] == "acme/r" and theirs["owner"] == "acme"


# --- regional resources need a plan (R-TEN-3) --------------------------------------------

RESERVATION = {"region": "lab", "name": "web"}
DATASTORE_IN = {"type": "regional_datastore", "path": "/in", "datastore": "nas", "region": "lab"}
DATASTORE_OUT = {"type": "regional_datastore", "path": "/out", "datastore": "nas", "region": "lab"}


def spec(**kw: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, **kw})


def test_regional_resources_of_a_spec() -> None:
    assert tenancy.regional_uses(spec()) == []
    assert tenancy.regional_uses(spec(region="lab")) == []  # a pin alone uses no resource
    notebook = spec(type="notebook", reservation=RESERVATION)
    assert tenancy.regional_uses(notebook) == [
        ("spec.reservation", "port reservation web in region lab")
    ]
    inference = spec(type="inference", input_data=DATASTORE_IN, output_data=DATASTORE_OUT)
    assert [f for f, _ in tenancy.regional_uses(inference)] == [
        "spec.input_data.datastore",
        "spec.output_data.datastore",
    ]
    # a datastore named with another type is still mounted from the datastore (mounts.py)
    named = spec(type="training", output_data={"type": "aws", "path": "s3://b", "datastore": "nas"})
    assert [f for f, _ in tenancy.regional_uses(named)] == ["spec.output_data.datastore"]


def test_free_plans_are_refused_regional_resources_naming_field_and_rule() -> None:
    uses = tenancy.regional_uses(spec(type="notebook", reservation=RESERVATION))
    reply = tenancy.plan_refusal("bob", Plan.free, uses)
    assert reply is not None
    assert reply.error.code == "invalid"
    assert "bob" in reply.error.message and "free" in reply.error.message
    [field] = reply.error.fields
    assert (field.field, field.rule) == ("spec.reservation", "R-TEN-3")
    assert field.valid and "team" in field.valid


@pytest.mark.parametrize("plan", [Plan.team, Plan.enterprise])
def test_team_and_enterprise_plans_have_regional_resources(plan: Plan) -> None:
    uses = tenancy.regional_uses(spec(type="notebook", reservation=RESERVATION))
    assert tenancy.plan_refusal("acme", plan, uses) is None


def test_a_job_without_regional_resources_needs_no_plan() -> None:
    assert tenancy.plan_refusal("bob", Plan.free, []) is None


# --- gpufleet project ... ----------------------------------------------------------------

runner = CliRunner(env={"GPUFLEET_ACCOUNT": "acme", "COLUMNS": "200"})


def replying(monkeypatch: pytest.MonkeyPatch, replies: dict[str, Any]) -> list[tuple[str, Any]]:
    """Replies by base subject; records (subject as sent, body)."""
    asked: list[tuple[str, Any]] = []

    def send(
        subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
    ) -> bytes:
        asked.append((subject, json.loads(payload)))
        return json.dumps(replies[subject.rsplit(".", 1)[0]]).encode()

    monkeypatch.setattr(client, "send", send)
    return asked


PROJECT = {"id": "acme/research", "name": "research", "owner": "acme", "role": "owner"}


def test_project_create_and_members(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replying(
        monkeypatch,
        {
            CreateProject.SUBJECT: {**PROJECT, "members": []},
            AddProjectMember.SUBJECT: {**PROJECT, "members": ["bob"]},
            RemoveProjectMember.SUBJECT: {**PROJECT, "members": []},
        },
    )
    result = runner.invoke(app, ["project", "create", "research"])
    assert result.exit_code == 0, result.output
    assert "acme/research" in result.stdout and "no members" in result.stdout
    result = runner.invoke(app, ["project", "add-member", "research", "bob"])
    assert result.exit_code == 0, result.output
    assert "bob" in result.stdout
    result = runner.invoke(app, ["project", "remove-member", "research", "bob"])
    assert result.exit_code == 0, result.output
    assert asked == [
        (as_account(CreateProject.SUBJECT, "acme"), {"name": "research"}),
        (as_account(AddProjectMember.SUBJECT, "acme"), {"project": "research", "account": "bob"}),
        (
            as_account(RemoveProjectMember.SUBJECT, "acme"),
            {"project": "research", "account": "bob"},
        ),
    ]


def test_project_list_table_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = {
        "projects": [
            {**PROJECT, "members": ["bob", "carol"], "created_at": None},
            {"id": "zed/shared", "name": "shared", "owner": "zed", "role": "member"},
        ]
    }
    replying(monkeypatch, {ListProjects.SUBJECT: listing})
    result = runner.invoke(app, ["project", "list"])
    assert result.exit_code == 0, result.output
    mine = next(line for line in result.stdout.splitlines() if "acme/research" in line)
    assert "owner" in mine and "bob, carol" in mine
    theirs = next(line for line in result.stdout.splitlines() if "zed/shared" in line)
    assert "member" in theirs
    result = runner.invoke(app, ["project", "list", "--json"])
    assert json.loads(result.stdout) == listing


def test_project_refusal_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    refusal = {
        "ok": False,
        "error": {
            "code": "not_found",
            "message": "project zed/shared not found",
            "fields": [{"field": "project", "rule": "R-TEN-2", "message": "no project"}],
        },
    }
    replying(monkeypatch, {AddProjectMember.SUBJECT: refusal})
    result = runner.invoke(app, ["project", "add-member", "zed/shared", "bob"])
    assert result.exit_code == 1
    assert "not found" in result.output
