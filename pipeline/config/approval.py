"""``[jobs.NAME.approval]``: the two-person rule — which actions on a job wait for a second person
(the rules: :mod:`handlers.approval.twoperson`; the record: :mod:`pipeline.state.approvals`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from pipeline.config.base import Seconds, _Model, must

#: what ``actions`` may list: ``restart_with_patch`` is a restart that applies or reverts a patch;
#: ``restart`` is every restart (with or without patches)
ApprovalAction = Literal["restart_with_patch", "restart", "start", "stop", "unlock"]

#: the role names ``approvers`` may list besides user and user-group ids (roles of ``[auth]``,
#: or of ``[jobs.NAME.auth]`` where the job sets them)
APPROVER_ROLES = ("admin", "operator", "viewer")

DEFAULT_EXPIRES = 900.0  #: seconds a request stays open (15 min)


_TOO_LONG = "at most 7 days (a request older than that is stale)"


def _approvers(v: list[str]) -> list[str]:
    for who in v:
        if who.endswith("s") and who[:-1] in APPROVER_ROLES:
            raise ValueError(f"approver {who!r}: the role is written {who[:-1]!r}")
        if not who.strip() or who != who.strip() or who == "*":
            raise ValueError(
                f"approver {who!r}: use a role ({', '.join(APPROVER_ROLES)}), a user id (U…) or a "
                "user-group id (S…); '*' would let anyone approve"
            )
    return v


class ApprovalSettings(_Model):
    """An action in ``actions`` becomes a request that waits until someone in ``approvers`` other than
    the requester approves it (or denies it, or ``expires`` seconds pass)."""

    actions: list[ApprovalAction] = Field(min_length=1)
    #: role names (``admin``, ``operator``, ``viewer``), user ids (``U…``) or user-group ids (``S…``)
    approvers: Annotated[list[str], AfterValidator(_approvers)] = Field(min_length=1)
    expires: Annotated[Seconds, must(lambda v: v <= 7 * 86400, _TOO_LONG)] = DEFAULT_EXPIRES
