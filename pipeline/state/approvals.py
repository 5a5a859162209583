"""Requests waiting for a person: an approval (a second person's, under the two-person rule) and a
confirmation (the requester's own, in time).

Approval requests: an action under the two-person rule waits here until a second person decides.

A request takes the id its run will have (``r-<n>``, reserved from the run counter), so
``approve r-7`` names the run it starts.  It is not a run: no owner, no heartbeat, so it outlives
the process that made it and is never taken for an orphaned run.

Its state (:class:`ApprovalState`) changes only through :meth:`Approvals.decide`, one compare-and-set
(:meth:`~pipeline.state.redisconn.Store.swap`), so across replicas the first decision wins (``pending`` → ``approved`` | ``denied`` | ``expired``,
then never again); :meth:`Approvals.reopen` is the one way back.  Decided records are kept
:data:`KEEP` s for ``history``.

Confirmations: a job with ``confirm = true`` acts only when the same person confirms in time.  The
request waits in Redis under a random token carried by the Confirm/Cancel buttons, so any replica
can take the click.  :meth:`Confirmations.take` settles it atomically (compare-and-set): one of the
requester's click, a double click and the expiry timer wins; someone else's click is refused and
leaves it waiting.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from redis.asyncio.client import Pipeline

from pipeline.errors import IllegalTransition, UnknownRun
from pipeline.state import keys
from pipeline.state.audit import Actor
from pipeline.state.redisconn import Store, ms

KEEP = 7 * 86400  #: seconds a decided request is kept (``history``)
DEFAULT_WINDOW = 60.0  #: seconds a confirmation waits
GRACE = 5.0  #: extra seconds a confirmation's Redis record outlives the window (the timer settles first)

T = TypeVar("T")
#: a tuple stored as a JSON list; records decided by the former Lua scripts hold ``{}`` for an empty one
Items = Annotated[tuple[T, ...], BeforeValidator(lambda value: value or ())]


class ApprovalState(StrEnum):
    """Where a request stands."""

    PENDING = "pending"  #: waiting for a second person
    APPROVED = "approved"  #: approved: its action ran (or was started) in the approver's process
    DENIED = "denied"  #: denied by an approver (with a reason, when given)
    EXPIRED = "expired"  #: nobody decided within ``expires``
    REFUSED = "refused"  #: approved, but the requester no longer holds the role: closed unrun (``reason``)


#: each decision → the states it is legal from (only a pending request is decided)
TRANSITIONS: dict[ApprovalState, frozenset[ApprovalState]] = dict.fromkeys(
    (ApprovalState.APPROVED, ApprovalState.DENIED, ApprovalState.EXPIRED, ApprovalState.REFUSED),
    frozenset({ApprovalState.PENDING}),
)


@dataclass(frozen=True)
class PatchDigest:
    """One patch file as it was shown for approval."""

    name: str  #: the patch's configured name
    sha256: str  #: SHA-256 of the file's bytes, 64 hex digits (``sha256sum`` of the file)
    diffstat: Items[str] = ()  #: ``path | +3 -1`` lines, one per file the patch changes
    size: int = 0  #: bytes


class ApprovalRequest(BaseModel):
    """A request waiting for (or past) a second person's decision, stored as JSON.  Times are unix seconds."""

    model_config = ConfigDict(frozen=True)

    id: str  #: the reserved run id (``r-7``)
    job: str
    action: str  #: the policy's name for it (``restart_with_patch``, ``restart``, ``stop`` …)
    command: str  #: the parsed command as JSON text (``handlers.grammar.commands.Command.dumps``)
    text: str  #: the command written out (``restart dflash with topk patch``)
    requester: str
    groups: Items[str]  #: the requester's user groups
    channel: str | None
    surface: str
    created_at: float
    expires_at: float
    patches: Items[PatchDigest] = ()  #: applied or reverted, as shown (their hashes are approved)
    state: ApprovalState = ApprovalState.PENDING
    decided_by: str = ""  #: who approved or denied (empty until decided, and for an expiry)
    decided_at: float | None = None
    reason: str = ""
    actor: Actor | None = None  #: the requester as their surface proved them (None: older records)
    decider: Actor | None = None  #: who decided, as their surface proved them

    @property
    def real_requester(self) -> str:
        """The Slack id of who really asked (an admin's own id when they asked ``--as`` someone)."""
        return self.actor.real if self.actor is not None else self.requester

    @property
    def hashes(self) -> dict[str, str]:
        """Patch name → the SHA-256 that was approved."""
        return {p.name: p.sha256 for p in self.patches}


class Decided(StrEnum):
    """What :meth:`Approvals.decide` came to."""

    WON = "won"  #: this decision is the request's
    LOST = "lost"  #: another decision came first (the request as it was decided is returned)
    SELF = "self"  #: the requester tried to approve their own request: refused, still pending
    EXPIRED = "expired"  #: it came after ``expires_at``: the request is closed as expired now


class Approvals(Store):
    """Approval requests in Redis."""

    async def open(self, request: ApprovalRequest) -> ApprovalRequest:
        """Store a new pending request under a freshly reserved run id (``request.id`` is ignored);
        returns it as stored."""
        n = await self.client.incr(keys.run_seq(self.prefix))
        stored = request.model_copy(update={"id": f"r-{n}", "state": ApprovalState.PENDING})
        ttl = max(1, int(stored.expires_at - time.time() + KEEP))
        async with self.client.pipeline(transaction=True) as pipe:
            self._put(pipe, stored, ex=ttl)
            await pipe.execute()
        return stored

    async def find(self, request_id: str) -> ApprovalRequest | None:
        """The request ``request_id``, or None (a run id that was never a request, or one older than :data:`KEEP`)."""
        raw = await self.client.get(keys.approval(self.prefix, request_id))
        return None if raw is None else ApprovalRequest.model_validate_json(raw)

    async def decide(
        self,
        request_id: str,
        state: ApprovalState,
        user: str = "",
        reason: str = "",
        decider: Actor | None = None,
    ) -> tuple[Decided, ApprovalRequest]:
        """Decide a pending request, atomically: the first decision wins across replicas.  The
        requester never approves their own: ``user`` is compared with both who it was asked as and
        who really asked (:attr:`ApprovalRequest.real_requester`).

        :param state: ``approved``, ``denied``, ``refused`` or ``expired`` (by the expiry sweep: ``user`` empty).
        :param reason: why (a denial's reason), at most 500 characters kept.
        :param decider: who decided, as their surface proved them (kept on the request).
        :returns: the outcome and the request as it stands after the call.
        :raises UnknownRun: if there is no such request.
        :raises IllegalTransition: if ``state`` is not a decision (``pending``).
        """
        what = f"approval {request_id}"
        if state not in TRANSITIONS:
            raise IllegalTransition(what, "pending", state.value)

        def settle(raw: str | bytes | None, pipe: Pipeline) -> tuple[Decided, ApprovalRequest]:
            if raw is None:
                raise UnknownRun(request_id)
            request = ApprovalRequest.model_validate_json(raw)
            if request.state is not ApprovalState.PENDING:
                return Decided.LOST, request
            if state is ApprovalState.APPROVED and user in (request.requester, request.real_requester):
                return Decided.SELF, request
            now = time.time()
            if late := state is not ApprovalState.EXPIRED and now > request.expires_at:
                decision = {"state": ApprovalState.EXPIRED, "decided_by": "", "decided_at": now}
            else:
                decision = {"state": state, "decided_by": user, "reason": reason[:500], "decided_at": now}
                decision |= {"decider": decider}
            outcome = Decided.EXPIRED if late else Decided.WON
            return outcome, self._put(pipe, request.model_copy(update=decision), ex=KEEP)

        return await self.swap(keys.approval(self.prefix, request_id), settle, what, state.value)

    async def reopen(self, request_id: str, approver: str) -> ApprovalRequest | None:
        """Approved → pending again, atomically, when the approval could not be acted on (another
        restart took the job's lock meanwhile): returns it, or None if not approved by ``approver``."""

        def back(raw: str | bytes | None, pipe: Pipeline) -> ApprovalRequest | None:
            request = None if raw is None else ApprovalRequest.model_validate_json(raw)
            if request is None or (request.state, request.decided_by) != (ApprovalState.APPROVED, approver):
                return None
            update = {"state": ApprovalState.PENDING, "decided_by": "", "reason": "", "decided_at": None}
            update |= {"decider": None}
            return self._put(pipe, request.model_copy(update=update))

        return await self.swap(
            keys.approval(self.prefix, request_id), back, f"approval {request_id}", "reopen"
        )

    def _put(self, pipe: Pipeline, request: ApprovalRequest, ex: int | None = None) -> ApprovalRequest:
        """Queue the write of ``request`` on ``pipe``, kept ``ex`` s (None: its TTL kept), in the open set
        while pending; returns it."""
        pipe.set(keys.approval(self.prefix, request.id), request.model_dump_json(), ex=ex, keepttl=ex is None)
        if request.state is ApprovalState.PENDING:
            pipe.zadd(keys.approvals_open(self.prefix), {request.id: request.expires_at})
        else:
            pipe.zrem(keys.approvals_open(self.prefix), request.id)
        return request

    async def pending(self, job: str | None = None) -> list[ApprovalRequest]:
        """Requests still pending (expired ones included until the sweep closes them), oldest first,
        of one ``job`` (case-insensitive) or all."""
        ids = await self.client.zrange(keys.approvals_open(self.prefix), 0, -1)
        if not ids:
            return []
        raws = await self.client.mget([keys.approval(self.prefix, str(i)) for i in ids])
        found = [ApprovalRequest.model_validate_json(r) for r in raws if r is not None]
        return [r for r in found if job is None or r.job.lower() == job.lower()]

    async def due(self, now: float | None = None) -> list[str]:
        """Ids of pending requests whose ``expires_at`` has passed (for the expiry sweep)."""
        at = time.time() if now is None else now
        return [str(i) for i in await self.client.zrangebyscore(keys.approvals_open(self.prefix), "-inf", at)]


# --- confirmations --------------------------------------------------------------------------------


class Pending(BaseModel, frozen=True):
    """A request waiting for confirmation (kept as JSON: ``model_dump_json``)."""

    token: str = Field(default_factory=lambda: secrets.token_urlsafe(12))  #: the id the buttons carry
    user: str
    groups: tuple[str, ...]
    text: str
    command: str  #: the parsed command as JSON text
    channel: str | None
    surface: str
    created_at: float = Field(default_factory=time.time)  #: unix s
    window: float = DEFAULT_WINDOW  #: seconds it may wait
    actor: Actor | None = None  #: the requester as their surface proved them (None: older records)


class Take(StrEnum):
    """What :meth:`Confirmations.take` found."""

    TAKEN = "taken"  #: this caller settled it
    GONE = "gone"  #: expired, or already settled by someone else
    NOT_YOURS = "not_yours"  #: another user's confirmation: left waiting
    EXPIRED = "expired"  #: found, but its window had passed (settled as expired)


class Confirmations(Store):
    """Pending confirmations in Redis."""

    async def add(self, pending: Pending) -> Pending:
        """Store ``pending`` for its ``window`` s (and :data:`GRACE`); returns it (its token goes on the buttons)."""
        key = keys.confirmation(self.prefix, pending.token)
        await self.client.set(key, pending.model_dump_json(), px=ms(pending.window + GRACE))
        return pending

    async def take(self, token: str, user: str | None) -> tuple[Take, Pending | None]:
        """Settle a confirmation clicked by ``user`` (None: the expiry timer, always allowed); returns the
        outcome and the pending request (None when gone)."""

        def settle(raw: str | bytes | None, pipe: Pipeline) -> tuple[Take, Pending | None]:
            pending = None if raw is None else Pending.model_validate_json(raw)
            if pending is None or (user is not None and user != pending.user):
                return (Take.GONE if pending is None else Take.NOT_YOURS), pending
            pipe.delete(key)
            late = user is not None and time.time() > pending.created_at + pending.window
            return (Take.EXPIRED if late else Take.TAKEN), pending

        key = keys.confirmation(self.prefix, token)
        return await self.swap(key, settle, f"confirmation {token}", "take")
