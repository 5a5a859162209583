"""The audit trail: every request and what became of it, in a capped Redis stream.

Accepted, denied, refused, invalid, failed, duplicate — each request the dispatcher sees is
one ``XADD … MAXLEN ~ 10000`` entry: who, when, the text, the parsed command as JSON, the
outcome, a one-line detail and the run id.  ``history`` reads it newest first.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, field_validator

from pipeline.state import keys
from pipeline.state.redisconn import Store

STREAM_MAXLEN = 10_000
_SCAN_BATCH = 200


class AuditOutcome(StrEnum):
    """What became of a request."""

    ACCEPTED = "accepted"  #: acted on (or answered, for reads)
    DENIED = "denied"  #: the requester lacks the role
    REFUSED = "refused"  #: another restart was in flight
    INVALID = "invalid"  #: the text did not parse
    FAILED = "failed"  #: an expected failure (host unreachable, …)
    ERROR = "error"  #: an unexpected failure (incident id in the detail)
    DUPLICATE = "duplicate"  #: a repeated delivery, not acted on again
    PENDING = "pending"  #: waiting for the requester's confirmation
    CONFIRMED = "confirmed"  #: the requester confirmed
    CANCELLED = "cancelled"  #: declined, or not confirmed in time
    FORCED = "forced"  #: ``unlock`` freed a lock someone held
    AWAITING = "awaiting_approval"  #: waiting for a second person (the two-person rule)
    APPROVED = "approved"  #: a second person approved it (the approver's record)
    REJECTED = "rejected"  #: an approver denied it (with the reason)
    EXPIRED = "expired"  #: nobody decided it in time
    BREAK_GLASS = "break_glass"  #: an admin acted without approval, with a reason


#: outcomes ``history`` shows under the two-person rule
APPROVALS = frozenset(
    {AuditOutcome.AWAITING, AuditOutcome.APPROVED, AuditOutcome.REJECTED, AuditOutcome.EXPIRED}
    | {AuditOutcome.BREAK_GLASS}
)


#: outcomes ``history`` shows as refused requests
REFUSALS = frozenset({AuditOutcome.DENIED, AuditOutcome.REFUSED, AuditOutcome.FAILED, AuditOutcome.ERROR})


#: what ``history`` calls each surface (``say`` is ``pitstop say``: the CLI)
SURFACE_NAMES = {"slack": "slack", "action": "slack", "home": "slack", "say": "cli", "console": "console"}


class Actor(BaseModel, frozen=True):
    """Who acted and through which door, as the surface proved it (sudo's ``SUDO_USER`` beside the
    user it runs as): kept on every run, approval request and audit record.

    In Slack the actor is the signed user id; in the CLI and console it is the OS user running
    Pitstop, mapped to a Slack id by ``[auth.cli]`` (unproven without it).
    """

    user: str  #: the Slack id acted as (roles are this id's)
    surface: str = ""  #: ``slack`` | ``action`` | ``home`` | ``console`` | ``say`` | ``scheduler``
    by: str = ""  #: the real actor's Slack id when acting for ``user`` (an admin's ``--as``): "by as user"
    os_user: str = ""  #: the OS user running the CLI or console ("" in Slack)
    proven: bool = True  #: False: a CLI or console without ``[auth.cli]``, whose ``user`` nothing proves

    @property
    def real(self) -> str:
        """The Slack id of who really acted (``by``, else ``user``): the two-person rule compares these."""
        return self.by or self.user

    @property
    def door(self) -> str:
        """``cli: maya``, ``console: maya``, ``slack`` (the surface as ``history`` names it, with the
        OS user for the CLI and console); "" when the surface is unknown (older records)."""
        name = SURFACE_NAMES.get(self.surface, self.surface)
        return f"{name}: {self.os_user}" if self.os_user else name


def _outcome(value: Any) -> AuditOutcome:
    """An outcome as stored; one this version does not know reads as ``error``."""
    return AuditOutcome(value) if value in AuditOutcome._value2member_map_ else AuditOutcome.ERROR


class AuditEntry(BaseModel, frozen=True):
    """One audit record, as its stream fields (missing ones, and None, read as empty; ``text`` and
    ``detail`` are cut at 2,000 characters)."""

    id: str = ""  #: the stream id (time-ordered)
    ts: float = Field(default_factory=time.time)  #: unix s
    user: str = ""
    surface: str = ""
    channel: str = ""
    text: str = ""
    verb: str = ""
    job: str = ""
    command: str = (
        ""  #: the parsed command as JSON text (:meth:`handlers.grammar.commands.Command.dumps`), or empty
    )
    outcome: Annotated[AuditOutcome, BeforeValidator(_outcome)] = AuditOutcome.ERROR
    detail: str = ""
    run_id: str = ""
    by: str = ""  #: the real actor when acting for ``user`` (:attr:`Actor.by`)
    os_user: str = ""  #: the OS user of a CLI or console request (:attr:`Actor.os_user`)

    @property
    def actor(self) -> Actor:
        """Who made the request, through which surface."""
        return Actor(user=self.user, surface=self.surface, by=self.by, os_user=self.os_user)

    @field_validator("channel", "text", "job", "detail", "run_id", mode="before")
    @classmethod
    def _text(cls, value: str | None) -> str:
        return (value or "")[:2000]


class Audit(Store):
    """Write and read the audit stream."""

    async def record(self, entry: AuditEntry) -> str:
        """Append ``entry`` to the stream (its ``id`` is the stream's to give).

        :returns: its stream id.
        """
        fields: Any = entry.model_dump(mode="json", exclude={"id"})
        return str(
            await self.client.xadd(keys.audit(self.prefix), fields, maxlen=STREAM_MAXLEN, approximate=True)
        )

    async def recent(
        self,
        *,
        job: str | None = None,
        outcomes: Collection[AuditOutcome] | None = None,
        count: int = 10,
        scan: int = 2000,
    ) -> list[AuditEntry]:
        """Up to ``count`` records, newest first, optionally of one ``job`` (case-insensitive) and some
        ``outcomes``, reading at most ``scan`` records looking for matches."""
        out: list[AuditEntry] = []
        upper = "+"
        for _ in range(0, scan, _SCAN_BATCH):
            batch: Any = await self.client.xrevrange(keys.audit(self.prefix), max=upper, count=_SCAN_BATCH)
            entries = (AuditEntry.model_validate({**fields, "id": i}) for i, fields in batch)
            out += [
                e
                for e in entries
                if (job is None or e.job.lower() == job.lower())
                and (outcomes is None or e.outcome in outcomes)
            ]
            if len(out) >= count or len(batch) < _SCAN_BATCH:
                break
            upper = f"({batch[-1][0]}"  # exclusive: the next page starts below the last entry read
        return out[:count]
