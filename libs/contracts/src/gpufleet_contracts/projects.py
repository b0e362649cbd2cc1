"""Projects (PRODUCT.md R-TEN-1): the scheduler's requests, and how a job names its project.

A project has one owner account and member accounts. A job's `spec.project` is either a plain
name, the acting account's own project (created on first use), or `<owner>/<name>`, another
account's project that the acting account is a member of: the job is then a federated one,
owned (and paid for) by the project's owner and created by the acting account (R-BILL-2).
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from . import subjects
from .base import Command
from .fields import Int, Name
from .subjects import ACCOUNT_RE

PROJECT_NAME_CHARS = 64
ACCOUNT_CHARS = 64  # subjects.ACCOUNT_RE
# `<owner>/<name>`: an account name, a slash, a project name.
PROJECT_REF_CHARS = ACCOUNT_CHARS + 1 + PROJECT_NAME_CHARS
PROJECT_MEMBERS = 256  # member accounts of one project
PROJECT_NAME_VALID = f"1-{PROJECT_NAME_CHARS} printable characters without '/'"
PROJECT_REF_VALID = (
    f"a project of yours ({PROJECT_NAME_VALID}), or <owner>/<name> for a project of another "
    "account that you are a member of"
)


class ProjectRef(NamedTuple):
    """A parsed project reference: `owner` is None for a plain name (the acting account's)."""

    owner: str | None
    name: str

    def owner_for(self, account: str) -> str:
        return self.owner or account

    def id_for(self, account: str) -> str:
        """The project's id (`<owner>/<name>`), as `account` names it."""
        return project_id(self.owner_for(account), self.name)


def project_id(owner: str, name: str) -> str:
    return f"{owner}/{name}"


def _refused(message: str, valid: str, **ctx: object) -> PydanticCustomError:
    return PydanticCustomError("project_ref", message, {**ctx, "rule": "R-TEN-1", "valid": valid})


def _name_part(name: str, ref: str) -> None:
    if not name:
        raise _refused("project '{ref}' has an empty name", PROJECT_REF_VALID, ref=ref)
    if len(name) > PROJECT_NAME_CHARS:
        raise _refused(
            "a project name is at most {limit} characters, got {count}",
            PROJECT_NAME_VALID,
            limit=PROJECT_NAME_CHARS,
            count=len(name),
        )
    if name != name.strip():
        raise _refused(
            "project name '{name}' has leading or trailing whitespace",
            PROJECT_NAME_VALID,
            name=name,
        )


def parse_project(ref: str) -> ProjectRef:
    """`name` or `<owner>/<name>`; raises PydanticCustomError (rule R-TEN-1) otherwise.

    Control and format characters are refused before this, by `Name` (schema:name_chars)."""
    owner, slash, name = ref.partition("/")
    if not slash:
        _name_part(ref, ref)
        return ProjectRef(None, ref)
    if not ACCOUNT_RE.fullmatch(owner):
        raise _refused(
            "'{owner}' (before the '/') is not an account name",
            "<owner>/<name>, the owner an account name (letters, digits, '-', '_')",
            owner=owner,
        )
    if "/" in name:
        raise _refused("project '{ref}' has more than one '/'", PROJECT_REF_VALID, ref=ref)
    _name_part(name, ref)
    return ProjectRef(owner, name)


def _check_ref(ref: str) -> str:
    parse_project(ref)
    return ref


def _check_name(name: str) -> str:
    if "/" in name:
        raise _refused(
            "a project name has no '/' (it is always created in your own account)",
            PROJECT_NAME_VALID,
        )
    _name_part(name, name)
    return name


# pydantic formats `{key}` in these messages, never `{key!r}`: quotes are written out.
# A job's `project` and the `project` of membership requests: `name` or `<owner>/<name>`.
ProjectRefStr = Annotated[
    Name, Field(min_length=1, max_length=PROJECT_REF_CHARS), AfterValidator(_check_ref)
]
# The name a new project gets (in the acting account).
ProjectName = Annotated[
    Name, Field(min_length=1, max_length=PROJECT_NAME_CHARS), AfterValidator(_check_name)
]
AccountName = Annotated[str, Field(pattern=ACCOUNT_RE.pattern)]


class ProjectView(BaseModel):
    """A project as the acting account sees it: its owner sees the members (None for a member)."""

    id: str
    name: str
    owner: str
    role: str  # owner | member
    members: list[str] | None = None
    created_at: str | None = None

    @model_serializer(mode="wrap")
    def _members_for_owners(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A member's view has no `members` key at all (not even null): only the owner's."""
        data: dict[str, Any] = handler(self)
        if self.members is None:
            data.pop("members", None)
        return data


class CreateProject(Command):
    """A new project of the acting account, with no members yet. Using a plain project name
    in a job creates it too; creating one that exists is a conflict."""

    TYPE = "gpufleet.project.create.v1"
    SUBJECT = subjects.rpc("scheduler", "create_project")
    REPLY = ProjectView
    name: ProjectName


class AddProjectMember(Command):
    """Let another account submit jobs to one of the acting account's projects (as
    `<owner>/<name>`): federated jobs, paid by the project's owner, the creator paying the
    federated fee (R-BILL-2). Only the owner may add or remove members."""

    TYPE = "gpufleet.project.add_member.v1"
    SUBJECT = subjects.rpc("scheduler", "add_project_member")
    REPLY = ProjectView
    project: ProjectRefStr
    account: AccountName


class RemoveProjectMember(Command):
    """The account may no longer submit to the project; its jobs there stay (and stay visible
    to it, their creator)."""

    TYPE = "gpufleet.project.remove_member.v1"
    SUBJECT = subjects.rpc("scheduler", "remove_project_member")
    REPLY = ProjectView
    project: ProjectRefStr
    account: AccountName


class ProjectList(BaseModel):
    projects: list[ProjectView]


class ListProjects(Command):
    """The projects the acting account owns (with their members) or is a member of."""

    TYPE = "gpufleet.project.list.v1"
    SUBJECT = subjects.rpc("scheduler", "list_projects")
    REPLY = ProjectList
    READ = True
    limit: Int = Field(default=100, ge=1, le=1000)
