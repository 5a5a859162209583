"""Approval requests: an action under the two-person rule waits here until a second person decides.

A request takes the id its run will have (``r-<n>``, reserved from the run counter), so
``approve r-7`` names the run it starts.  It is not a run: no owner, no heartbeat, so it outlives
the process that made it and is never taken for an orphaned run.

Its state (:class:`ApprovalState`) changes only through :meth:`Approvals.decide`, one Lua script,
so across replicas the first decision wins (``pending`` → ``approved`` | ``denied`` | ``expired``,
then never again); :meth:`Approvals.reopen` is the one way back.  Decided records are kept
:data:`KEEP` s for ``history``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from pipeline.errors import IllegalTransition, UnknownRun
from pipeline.state import keys
from pipeline.state.redisconn import Store

KEEP = 7 * 86400  #: seconds a decided request is kept (``history``)


class ApprovalState(StrEnum):
    """Where a request stands."""

    PENDING = "pending"  #: waiting for a second person
    APPROVED = "approved"  #: approved: its action ran (or was started) in the approver's process
    DENIED = "denied"  #: denied by an approver (with a reason, when given)
    EXPIRED = "expired"  #: nobody decided within ``expires``


#: each decision → the states it is legal from (only a pending request is decided)
TRANSITIONS: dict[ApprovalState, frozenset[ApprovalState]] = dict.fromkeys(
    (ApprovalState.APPROVED, ApprovalState.DENIED, ApprovalState.EXPIRED), frozenset({ApprovalState.PENDING})
)


@dataclass(frozen=True)
class PatchDigest:
    """One patch file as it was shown for approval."""

    name: str  #: the patch's configured name
    sha256: str  #: SHA-256 of the file's bytes, 64 hex digits (``sha256sum`` of the file)
    diffstat: tuple[str, ...] = ()  #: ``path | +3 -1`` lines, one per file the patch changes
    size: int = 0  #: bytes


@dataclass(frozen=True)
class ApprovalRequest:
    """A request waiting for (or past) a second person's decision.  Times are unix seconds."""

    id: str  #: the reserved run id (``r-7``)
    job: str
    action: str  #: the policy's name for it (``restart_with_patch``, ``restart``, ``stop`` …)
    command: str  #: the parsed command as JSON text (``handlers.grammar.commands.Command.dumps``)
    text: str  #: the command written out (``restart dflash with topk patch``)
    requester: str
    groups: tuple[str, ...]  #: the requester's user groups
    channel: str | None
    surface: str
    created_at: float
    expires_at: float
    patches: tuple[PatchDigest, ...] = ()  #: applied or reverted, as shown (their hashes are approved)
    state: ApprovalState = ApprovalState.PENDING
    decided_by: str = ""  #: who approved or denied (empty until decided, and for an expiry)
    decided_at: float | None = None
    reason: str = ""

    @property
    def hashes(self) -> dict[str, str]:
        """Patch name → the SHA-256 that was approved."""
        return {p.name: p.sha256 for p in self.patches}

    def dumps(self) -> str:
        """As JSON text."""
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: str | bytes) -> ApprovalRequest:
        """From :meth:`dumps` output."""
        data: dict[str, Any] = json.loads(raw)
        data["groups"] = tuple(data.get("groups") or ())
        data["patches"] = tuple(
            PatchDigest(**{**p, "diffstat": tuple(p.get("diffstat") or ())})
            for p in data.get("patches") or ()
        )
        data["state"] = ApprovalState(data.get("state", "pending"))
        return cls(**data)


class Decided(StrEnum):
    """What :meth:`Approvals.decide` came to."""

    WON = "won"  #: this decision is the request's
    LOST = "lost"  #: another decision came first (the request as it was decided is returned)
    SELF = "self"  #: the requester tried to approve their own request: refused, still pending
    EXPIRED = "expired"  #: it came after ``expires_at``: the request is closed as expired now


# KEYS[1] record, KEYS[2] open set; ARGV: state, user, reason, now, keep (s).
# Returns {outcome, record}: the record after the call.
_DECIDE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return {'missing', ''} end
local r = cjson.decode(raw)
if r.state ~= 'pending' then return {'lost', raw} end
local now = tonumber(ARGV[4])
if ARGV[1] == 'approved' and ARGV[2] == r.requester then return {'self', raw} end
local outcome = 'won'
if ARGV[1] ~= 'expired' and now > tonumber(r.expires_at) then
  outcome = 'expired'
  r.state = 'expired'
  r.decided_by = ''
else
  r.state = ARGV[1]
  r.decided_by = ARGV[2]
  r.reason = ARGV[3]
end
r.decided_at = now
local out = cjson.encode(r)
redis.call('SET', KEYS[1], out, 'EX', tonumber(ARGV[5]))
redis.call('ZREM', KEYS[2], r.id)
return {outcome, out}
"""


# KEYS[1] record, KEYS[2] open set; ARGV: approver.  Approved → pending again, by its approver only.
_REOPEN = """
local raw = redis.call('GET', KEYS[1])
if not raw then return '' end
local r = cjson.decode(raw)
if r.state ~= 'approved' or r.decided_by ~= ARGV[1] then return '' end
r.state = 'pending'
r.decided_by = ''
r.reason = ''
r.decided_at = nil
local out = cjson.encode(r)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
redis.call('ZADD', KEYS[2], r.expires_at, r.id)
return out
"""


class Approvals(Store):
    """Approval requests in Redis."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self._decide = client.register_script(_DECIDE)
        self._reopen = client.register_script(_REOPEN)

    async def open(self, request: ApprovalRequest) -> ApprovalRequest:
        """Store a new pending request under a freshly reserved run id (``request.id`` is ignored);
        returns it as stored."""
        n = await self.client.incr(keys.run_seq(self.prefix))
        stored = replace(request, id=f"r-{n}", state=ApprovalState.PENDING)
        ttl = max(1, int(stored.expires_at - time.time() + KEEP))
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(keys.approval(self.prefix, stored.id), stored.dumps(), ex=ttl)
            pipe.zadd(keys.approvals_open(self.prefix), {stored.id: stored.expires_at})
            await pipe.execute()
        return stored

    async def get(self, request_id: str) -> ApprovalRequest:
        """The request ``request_id`` (UnknownRun if there is none: never made, or older than :data:`KEEP`)."""
        if (request := await self.find(request_id)) is None:
            raise UnknownRun(request_id)
        return request

    async def find(self, request_id: str) -> ApprovalRequest | None:
        """The request ``request_id``, or None (a run id that was never a request)."""
        raw = await self.client.get(keys.approval(self.prefix, request_id))
        return None if raw is None else ApprovalRequest.loads(raw)

    async def decide(
        self, request_id: str, state: ApprovalState, user: str = "", reason: str = ""
    ) -> tuple[Decided, ApprovalRequest]:
        """Decide a pending request, atomically: the first decision wins across replicas.

        :param state: ``approved``, ``denied`` or ``expired`` (by the expiry sweep: ``user`` empty).
        :param reason: why (a denial's reason), at most 500 characters kept.
        :returns: the outcome and the request as it stands after the call.
        :raises UnknownRun: if there is no such request.
        :raises IllegalTransition: if ``state`` is not a decision (``pending``).
        """
        if state not in TRANSITIONS:
            raise IllegalTransition(f"approval {request_id}", "pending", state.value)
        answer: Any = await self._decide(
            keys=[keys.approval(self.prefix, request_id), keys.approvals_open(self.prefix)],
            args=[state.value, user, reason[:500], repr(time.time()), KEEP],
        )
        outcome, raw = str(answer[0]), answer[1]
        if outcome == "missing":
            raise UnknownRun(request_id)
        return Decided(outcome), ApprovalRequest.loads(raw)

    async def reopen(self, request_id: str, approver: str) -> ApprovalRequest | None:
        """Approved → pending again, atomically, when the approval could not be acted on (another
        restart took the job's lock meanwhile): returns it, or None if not approved by ``approver``."""
        raw = await self._reopen(
            keys=[keys.approval(self.prefix, request_id), keys.approvals_open(self.prefix)], args=[approver]
        )
        return ApprovalRequest.loads(raw) if raw else None

    async def pending(self, job: str | None = None) -> list[ApprovalRequest]:
        """Requests still pending (expired ones included until the sweep closes them), oldest first,
        of one ``job`` (case-insensitive) or all."""
        ids = await self.client.zrange(keys.approvals_open(self.prefix), 0, -1)
        if not ids:
            return []
        raws = await self.client.mget([keys.approval(self.prefix, str(i)) for i in ids])
        found = [ApprovalRequest.loads(r) for r in raws if r is not None]
        return [r for r in found if job is None or r.job.lower() == job.lower()]

    async def due(self, now: float | None = None) -> list[str]:
        """Ids of pending requests whose ``expires_at`` has passed (for the expiry sweep)."""
        at = time.time() if now is None else now
        return [str(i) for i in await self.client.zrangebyscore(keys.approvals_open(self.prefix), "-inf", at)]
