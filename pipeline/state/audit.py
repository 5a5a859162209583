"""The audit trail: every request and what became of it, in a capped Redis stream.

Accepted, denied, refused, invalid, failed, duplicate — each request the dispatcher sees is
one ``XADD … MAXLEN ~ 10000`` entry: who, when, the text, the parsed command as JSON, the
outcome, a one-line detail and the run id.  ``history`` reads it newest first.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from pipeline.state import keys
from pipeline.state.redisconn import Store, as_float

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


@dataclass(frozen=True)
class AuditEntry:
    """One audit record."""

    id: str  #: the stream id (time-ordered)
    ts: float  #: unix s
    user: str
    surface: str
    channel: str
    text: str
    verb: str
    job: str
    command: str  #: the parsed command as JSON text, or empty when it did not parse
    outcome: AuditOutcome
    detail: str
    run_id: str

    @classmethod
    def from_fields(cls, entry_id: str, fields: dict[str, Any]) -> AuditEntry:
        """An entry from its stream fields (unknown outcomes read as ``error``)."""
        try:
            outcome = AuditOutcome(fields.get("outcome", "error"))
        except ValueError:
            outcome = AuditOutcome.ERROR
        text = {name: str(fields.get(name, "")) for name in _TEXT_FIELDS}
        return cls(id=entry_id, ts=as_float(fields.get("ts")) or 0.0, outcome=outcome, **text)


_TEXT_FIELDS = ("user", "surface", "channel", "text", "verb", "job", "command", "detail", "run_id")


class Audit(Store):
    """Write and read the audit stream."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self.key = keys.audit(prefix)

    async def record(
        self,
        *,
        user: str,
        text: str,
        outcome: AuditOutcome,
        surface: str = "",
        channel: str | None = None,
        verb: str = "",
        job: str | None = None,
        command: str = "",
        detail: str = "",
        run_id: str | None = None,
    ) -> str:
        """Append one record (``command``: :meth:`handlers.grammar.commands.Command.dumps`); returns its stream id."""
        fields = {
            "ts": repr(time.time()),
            "user": user,
            "surface": surface,
            "channel": channel or "",
            "text": text[:2000],
            "verb": verb,
            "job": job or "",
            "command": command,
            "outcome": outcome.value,
            "detail": detail[:2000],
            "run_id": run_id or "",
        }
        return str(await self.client.xadd(self.key, fields, maxlen=STREAM_MAXLEN, approximate=True))  # type: ignore[arg-type]

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
        read = 0
        while len(out) < count and read < scan:
            batch: Any = await self.client.xrevrange(self.key, max=upper, count=_SCAN_BATCH)
            if not batch:
                break
            for entry_id, fields in batch:
                if entry_id == upper:
                    continue
                read += 1
                entry = AuditEntry.from_fields(str(entry_id), fields)
                if (job is None or entry.job.lower() == job.lower()) and (
                    outcomes is None or entry.outcome in outcomes
                ):
                    out.append(entry)
                    if len(out) >= count:
                        break
            last = str(batch[-1][0])
            if last == upper:
                break
            upper = last
        return out
