"""The two-person rule's step in the dispatcher (:class:`TwoPersonRule`, after confirmation).

- an action the job's ``[jobs.NAME.approval]`` holds becomes a request (id ``r-N``, the run it will
  be): its message shows what would change and who may approve; the requester gets exit code 7;
- ``approve r-N`` / ``deny r-N [reason]`` (typed or clicked): the requester never approves their own
  (exit 3) but may withdraw it; the first decision wins across replicas (the store's script); an
  approval while another restart holds the job's lock is refused (exit 4) and the request stays
  open; an approval runs the stored command here, on behalf of the requester, with the approved
  patch hashes on the run (re-checked at pre-flight);
- ``restart JOB --break-glass "reason"``: admins only, runs without approval, announced and marked;
- a request nobody decides closes at its expiry (a timer here, :meth:`TwoPersonRule.expire_due`
  from any replica), its buttons removed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from handlers import text as words
from handlers.approval import policy
from handlers.context import Context
from handlers.grammar.commands import Command, ParseError
from handlers.grammar.parse import Role
from handlers.reply import Reply, Status, refused
from handlers.request.auth import Denied, role_of
from handlers.request.flow import Flow, Next, Request, Spawn
from pipeline.errors import ExitCode, PitstopError
from pipeline.state.approvals import ApprovalRequest, Approvals, ApprovalState, Decided
from pipeline.state.audit import AuditOutcome
from pipeline.state.jobstate import scope_of
from pipeline.state.locks import InFlight

log = logging.getLogger(__name__)


#: the dispatcher's audit step, one record per request, never raising:
#: ``audit(req, outcome, command=None, *, detail="", run_id=None)``
AuditFn = Callable[..., Awaitable[None]]


class TwoPersonRule:
    """The step, and the expiry of requests."""

    def __init__(self, ctx: Context, audit: AuditFn, spawn: Spawn) -> None:
        self.ctx = ctx
        self.audit = audit
        self.spawn = spawn
        self.approvals = ctx.redis.open_store(Approvals)

    async def step(self, flow: Flow, call_next: Next) -> Reply:
        """A decision on a request runs it (or ends it); an action the job's policy holds waits for
        a second person; an admin's break glass passes, marked (:mod:`handlers.approval.policy`)."""
        command = flow.run
        assert command is not None
        if command.verb == "pending":
            await self.expire_due()
            return await call_next()
        if command.verb in ("approve", "deny"):
            return await self._decide(flow, call_next)
        if flow.approval is not None or flow.system:
            return await call_next()
        if command.break_glass is not None:
            if role_of(self.ctx.config, flow.req.user, flow.groups, command.job) is not Role.ADMIN:
                raise Denied(flow.req.user, command, Role.ADMIN)
            flow.break_glass, flow.outcome = command.break_glass, AuditOutcome.BREAK_GLASS
            return await call_next()
        settings = policy.approval_for(self.ctx.config, command)
        if settings is None:
            return await call_next()
        req = flow.on_behalf or flow.req
        assert command.job is not None
        now = time.time()
        request = await self.approvals.open(
            ApprovalRequest(
                id="",
                job=command.job,
                action=policy.policy_action(command) or command.verb,
                command=command.dumps(),
                text=command.text(),
                requester=req.user,
                groups=flow.groups,
                channel=req.channel,
                surface=req.surface,
                created_at=now,
                expires_at=now + settings.expires,
                patches=await policy.digests(self.ctx.config, command),
            )
        )
        files = await policy.attachments(self.ctx.config, request)
        await self._show(request, policy.request_reply(self.ctx.config, request, files))
        await self.audit(
            req, AuditOutcome.AWAITING, command, detail=words.approval_record(request), run_id=request.id
        )
        self.spawn(self._expire_at(request), f"pitstop-approval:{request.id}")
        return policy.waiting_reply(self.ctx.config, request)

    async def _show(self, request: ApprovalRequest, reply: Reply) -> None:
        """The request's message (the run's, ``run:r-N``), posted or updated in place."""
        channel = self.ctx.config.channel_for(request.job) if request.job in self.ctx.config.jobs else None
        try:
            await self.ctx.outbox.announce(f"run:{request.id}", reply, channel or request.channel)
        except Exception:
            log.warning("could not show approval request %s", request.id, exc_info=True)

    async def _decide(self, flow: Flow, call_next: Next) -> Reply:
        """``approve r-N`` / ``deny r-N [reason]`` (typed or clicked): the rules, then the first decision wins."""
        command, req, user = flow.run, flow.req, flow.req.user
        assert command is not None and command.run_ref is not None
        request = await self.approvals.find(command.run_ref)
        if request is None:
            raise ParseError(words.approval_not_request(command.run_ref))
        approving, asked = command.verb == "approve", _asked(request)
        settings = self.ctx.config.jobs[request.job].approval if request.job in self.ctx.config.jobs else None
        pending, refusal = request.state is ApprovalState.PENDING, None
        if pending and approving and user == request.requester:
            refusal = words.approval_self(request.id)
        elif (
            pending
            and (approving or user != request.requester)  # the requester may withdraw their own
            and not policy.may_approve(self.ctx.config, request, user, flow.groups)
        ):
            refusal = words.approval_not_approver(user, request.id, settings.approvers if settings else [])
        elif approving and pending and asked.spec.acts:
            # a restart in flight would refuse it: the request stays open for after it, not spent
            holder = await self.ctx.service.locks.holder(scope_of(self.ctx.config, request.job))
            if holder is not None:
                raise InFlight(request.job, holder)
        if refusal is None:
            state = ApprovalState.APPROVED if approving else ApprovalState.DENIED
            decided, request = await self.approvals.decide(request.id, state, user, command.reason or "")
            refusal = words.approval_self(request.id) if decided is Decided.SELF else None
        if refusal is not None:
            await self.audit(req, AuditOutcome.DENIED, asked, detail=refusal, run_id=request.id)
            return refused(refusal, ExitCode.DENIED)
        if decided is Decided.LOST:
            text = words.approval_already(request.id, request.state.value, request.decided_by)
            return refused(text, ExitCode.FAILED, Status.WARNING)
        await self._closed(request, req)
        if decided is Decided.EXPIRED:
            text = words.approval_expired(request.id, request.expires_at - request.created_at)
            return refused(text, ExitCode.CANCELLED, Status.WARNING)
        if not approving:
            return Reply(title=words.approval_denied_ack(request.id), status=Status.INFO, ephemeral=True)
        flow.run = asked
        flow.on_behalf = Request(
            request.text, request.requester, request.groups, req.delivery_id, request.channel, request.surface
        )
        flow.approval, flow.outcome = request, AuditOutcome.ACCEPTED
        try:
            return await call_next()
        except InFlight:  # another restart took the lock after the check: the approval is not spent
            reopened = await self.approvals.reopen(request.id, user)
            if reopened is not None:
                await self._show(reopened, policy.request_reply(self.ctx.config, reopened))
            raise

    async def _closed(self, request: ApprovalRequest, req: Request) -> None:
        """A request just decided or expired: its record in the audit trail (as the command it asked
        for, so ``history JOB`` finds it), its message without buttons."""
        outcome = {
            ApprovalState.APPROVED: AuditOutcome.APPROVED,
            ApprovalState.DENIED: AuditOutcome.REJECTED,
        }.get(request.state, AuditOutcome.EXPIRED)
        await self.audit(
            req, outcome, _asked(request), detail=words.approval_record(request), run_id=request.id
        )
        await self._show(request, policy.closed_reply(self.ctx.config, request))

    async def _expire_at(self, request: ApprovalRequest) -> None:
        await asyncio.sleep(max(0.0, request.expires_at - time.time()))
        await self.expire(request.id)

    async def expire(self, request_id: str) -> bool:
        """Close ``request_id`` as expired if it is still pending (its message loses its buttons);
        True if this call closed it."""
        decided, request = await self.approvals.decide(request_id, ApprovalState.EXPIRED)
        if decided is not Decided.WON:
            return False
        req = Request(request.text, request.requester, request.groups, None, request.channel, request.surface)
        await self._closed(request, req)
        return True

    async def expire_due(self) -> int:
        """Close every pending request past its expiry (those whose process died included); any
        replica may call it (the scheduler's tick, ``pending``): each closes once.  Returns how many
        this call closed."""
        closed = 0
        for request_id in await self.approvals.due():
            try:
                closed += await self.expire(request_id)
            except PitstopError:
                log.warning("could not expire approval request %s", request_id, exc_info=True)
        return closed


def _asked(request: ApprovalRequest) -> Command:
    """The command ``request`` asked for (as Pitstop stored it)."""
    return Command.loads(request.command)
