"""The tenancy rules of the scheduler (R-TEN-1..3), pure: who sees a job, what a project
shows to whom, and which parts of a spec use regional resources and so need a plan.

- A job belongs to a project; its `owner` is the project's owner (who pays, R-BILL-1) and its
  `creator` the account that submitted it (who pays the federated fee when they differ,
  R-BILL-2).
- A job is visible to its owner and its creator, and only they may cancel it (or read its
  logs): another member of the project sees nothing of it (R-TEN-2, "not found"). The owner
  answers for everything run in its projects; a member for what it ran.
- Regional resources (PRODUCT.md section 5: regional datastores, port reservations) need
  plan `team` or higher (R-TEN-3). The plan checked is the project owner's: the resources
  are the owner's (R-TEN-1: an account owns its regions) and the owner pays for the job.
"""

from __future__ import annotations

from gpufleet_contracts import ErrorBody, ErrorReply, FieldError
from gpufleet_contracts.identity import Plan, plan_allows_regional
from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.jobspec import StorageType
from gpufleet_store import Doc, from_ms

PLAN_VALID = "plan team or enterprise (an operator changes it: gpufleet admin account plan)"


def visible_to(account: str) -> Doc:
    """The query of the jobs `account` may see: those it owns or created."""
    return {"$or": [{"owner": account}, {"creator": account}]}


def may_see(job: Doc, account: str) -> bool:
    return account in (job.get("owner"), job.get("creator"))


def regional_uses(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, what) for each regional resource the spec uses (R-RES-2, R-RES-3)."""
    uses: list[tuple[str, str]] = []
    for field, loc in (("input_data", spec.input_data), ("output_data", spec.output_data)):
        # A datastore named with another type is mounted as one too (mounts.py).
        if loc is not None and (loc.type is StorageType.regional_datastore or loc.datastore):
            what = f"regional datastore {loc.datastore}" if loc.datastore else "regional datastore"
            uses.append((f"spec.{field}.datastore", what))
    if spec.reservation is not None:
        r = spec.reservation
        uses.append(("spec.reservation", f"port reservation {r.name} in region {r.region}"))
    return uses


def plan_refusal(owner: str, plan: Plan, uses: list[tuple[str, str]]) -> ErrorReply | None:
    """R-TEN-3: the refusal of a job that uses regional resources on a plan without them."""
    if not uses or plan_allows_regional(plan):
        return None
    return ErrorReply(
        error=ErrorBody(
            code="invalid",
            message=(
                f"regional resources need plan team or higher; account {owner} (the project's "
                f"owner) is on plan {plan.value}"
            ),
            fields=[
                FieldError(
                    field=field,
                    rule="R-TEN-3",
                    message=f"{what} is a regional resource: plan {plan.value} has none",
                    valid=PLAN_VALID,
                )
                for field, what in uses
            ],
        )
    )


def project_view(doc: Doc, account: str) -> Doc:
    """A project as `account` sees it: its owner sees the members, a member only its role."""
    owner = doc["owner"] == account
    view: Doc = {
        "id": doc["_id"],
        "name": doc["name"],
        "owner": doc["owner"],
        "role": "owner" if owner else "member",
    }
    if owner:
        view["members"] = sorted(doc.get("members") or [])
    created = from_ms(doc.get("created_ms"))
    view["created_at"] = None if created is None else created.isoformat()
    return view
