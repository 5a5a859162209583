"""The two-person rule: which requests wait, who may decide them, what they are shown, and its step
in the dispatcher (:class:`TwoPersonRule`, after confirmation).

A job's ``[jobs.NAME.approval]`` (:class:`~pipeline.config.ApprovalSettings`) lists the actions
that wait for a second person (:func:`approval_for`); :func:`may_approve` is the right to decide.
The state lives in :mod:`pipeline.state.approvals`.

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
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from handlers import text as words
from handlers.context import Context
from handlers.grammar.commands import Command, ParseError
from handlers.grammar.parse import Role
from handlers.reply import Attachment, Button, Reply, Status, refused
from handlers.request.auth import Denied, authorise, fresh_groups, own_act, role_of
from handlers.request.flow import Flow, Next, Request, Spawn
from pipeline import fmt
from pipeline.config import ApprovalSettings, Config
from pipeline.config.jobs import APPROVER_ROLES
from pipeline.engines.workdir import patch_digest, patch_text
from pipeline.errors import ExitCode, PitstopError
from pipeline.state.approvals import ApprovalRequest, Approvals, ApprovalState, Decided, PatchDigest
from pipeline.state.audit import AuditOutcome
from pipeline.state.jobstate import scope_of
from pipeline.state.locks import InFlight

log = logging.getLogger(__name__)


def policy_action(command: Command) -> str | None:
    """The command's action in ``[jobs.NAME.approval] actions`` words (a restart that applies or
    reverts a patch is ``restart_with_patch``; ``drain`` and ``undrain`` are ``drain``), or None for a verb no policy can hold (reads, ``approve``)."""
    if command.verb == "restart":
        return "restart_with_patch" if command.patches or command.without else "restart"
    if command.verb in ("drain", "undrain"):  # a node of the job's cluster taken out or returned
        return "drain"
    return command.verb if command.verb in ("start", "stop", "unlock") else None


def approval_for(config: Config, command: Command) -> ApprovalSettings | None:
    """The job's approval policy when ``command`` must wait for it, else None (``restart`` in
    ``actions`` holds every restart, patched or not)."""
    if command.job is None or command.job not in config.jobs:
        return None
    settings, action = config.jobs[command.job].approval, policy_action(command)
    if settings is None or action is None:
        return None
    held = set(settings.actions)
    return settings if action in held or (action == "restart_with_patch" and "restart" in held) else None


def may_approve(config: Config, request: ApprovalRequest, user: str, groups: Sequence[str]) -> bool:
    """Whether ``user`` (a member of ``groups``) may decide ``request``: ``approvers`` names them,
    one of their groups, or a role they hold for the job (roles nest: ``operator`` lets admins in)."""
    settings = config.jobs[request.job].approval if request.job in config.jobs else None
    if settings is None:
        return False
    if {user, *groups} & set(settings.approvers):
        return True
    held = role_of(config, user, groups, request.job)
    wanted = [Role[r.upper()] for r in settings.approvers if r in APPROVER_ROLES]
    return held is not None and any(held >= r for r in wanted)


async def digests(config: Config, command: Command) -> tuple[PatchDigest, ...]:
    """The patches ``command`` applies or reverts, as they are now: SHA-256, diffstat, size.
    :class:`PitstopError` if a patch file cannot be read (nothing is asked for then)."""
    assert command.job is not None
    paths = config.jobs[command.job].patches
    out = []
    for name in (*command.patches, *command.without):
        try:
            out.append(await asyncio.to_thread(patch_digest, name, paths[name]))
        except (OSError, UnicodeDecodeError) as exc:
            raise PitstopError(words.approval_unreadable(name, str(paths[name]), str(exc))) from None
    return tuple(out)


async def attachments(config: Config, request: ApprovalRequest) -> tuple[Attachment, ...]:
    """Each patch's whole diff as a file: the text ``git apply`` would be given, read again and kept
    only when the file's bytes still have the hash shown (a file edited since is left out, and
    pre-flight would refuse it anyway)."""
    files = []
    for digest in request.patches:
        path = config.jobs[request.job].patches.get(digest.name)
        if path is None:
            continue
        try:
            raw = await asyncio.to_thread(path.read_bytes)
            text = patch_text(raw)
        except (OSError, UnicodeDecodeError):
            continue
        if hashlib.sha256(raw).hexdigest() == digest.sha256:
            files.append(Attachment(path.name, text, f"{path.name} · sha256 {digest.sha256}", str(path)))
    return tuple(files)


def request_reply(config: Config, request: ApprovalRequest, files: tuple[Attachment, ...] = ()) -> Reply:
    """The run's message while its request waits: what would change (each patch's diffstat and
    SHA-256, the whole diff attached as ``files``), Approve/Deny, who may click."""
    return Reply(
        title=words.approval_waiting_title(request),
        status=Status.WARNING,
        lines=_waiting_lines(config, request),
        buttons=(
            Button(words.APPROVE_BUTTON, "approve", request.id, "primary"),
            Button(words.DENY_BUTTON, "deny", request.id, "danger"),
        ),
        attachments=files,
        thread_key=f"run:{request.id}",
    )


def closed_reply(config: Config, request: ApprovalRequest) -> Reply:
    """The request's message once decided or expired: the same facts, a line saying how it ended, no buttons."""
    if request.state is ApprovalState.APPROVED:
        head, tone = words.approval_approved(request.id, request.decided_by), Status.OK
    elif request.state is ApprovalState.DENIED:
        head, tone = words.approval_denied(request.id, request.decided_by, request.reason), Status.ERROR
    elif request.state is ApprovalState.REFUSED:
        head, tone = words.approval_refused(request.id, request.reason), Status.ERROR
    else:
        waited = request.expires_at - request.created_at
        head, tone = words.approval_expired(request.id, waited), Status.WARNING
    asked = words.approval_waiting_title(request)
    return Reply(
        title=head,
        status=tone,
        lines=(asked, *_patch_lines(request)),
        thread_key=f"run:{request.id}",
    )


def waiting_reply(config: Config, request: ApprovalRequest) -> Reply:
    """The requester's answer: it waits (exit code :attr:`ExitCode.AWAITING_APPROVAL`)."""
    return Reply(
        title=words.approval_asked(request.id, request.text),
        status=Status.WARNING,
        lines=_waiting_lines(config, request),
        ephemeral=True,
        thread_key=f"run:{request.id}",
        exit_code=ExitCode.AWAITING_APPROVAL,
    )


def pending_reply(config: Config, requests: Sequence[ApprovalRequest], job: str | None) -> Reply:
    """``pending [JOB]``: every request still waiting, oldest first."""
    if not requests:
        return Reply(title=words.pending_none(job), status=Status.INFO)
    lines = []
    for r in requests:
        hashes = ", ".join(f"{p.name} {p.sha256[: words.HASH_SHOWN]}" for p in r.patches) or "no patch"
        left = fmt.duration(max(0.0, r.expires_at - time.time()))
        lines.append(words.pending_line(r.id, r.text, r.requester, hashes, left))
    return Reply(title=words.pending_title(len(requests)), lines=tuple(lines), status=Status.INFO)


def _patch_lines(request: ApprovalRequest) -> list[str]:
    return [
        line
        for p in request.patches
        for line in (words.approval_patch(p.name, p.sha256, p.size), *(f"    {d}" for d in p.diffstat))
    ]


def _waiting_lines(config: Config, request: ApprovalRequest) -> tuple[str, ...]:
    settings = config.jobs[request.job].approval
    approvers = settings.approvers if settings is not None else []
    expires = fmt.clock(request.expires_at, config.scheduler.timezone)
    return (*_patch_lines(request), words.approval_who(approvers), words.approval_expires(expires))


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
        a second person; an admin's break glass passes, marked (:func:`approval_for`)."""
        command = flow.run
        assert command is not None
        if command.verb == "pending":
            await self.expire_due()
            return await call_next()
        if command.verb in ("approve", "deny"):
            own_act(flow.req.actor, command.verb)
            return await self._decide(flow, call_next)
        if flow.approval is not None or flow.system:
            return await call_next()
        if command.break_glass is not None:
            own_act(flow.req.actor, "--break-glass")
            if role_of(self.ctx.config, flow.req.user, flow.groups, command.job) is not Role.ADMIN:
                raise Denied(flow.req.user, command, Role.ADMIN)
            flow.break_glass, flow.outcome = command.break_glass, AuditOutcome.BREAK_GLASS
            return await call_next()
        settings = approval_for(self.ctx.config, command)
        if settings is None:
            return await call_next()
        req = flow.on_behalf or flow.req
        assert command.job is not None
        now = time.time()
        request = await self.approvals.open(
            ApprovalRequest(
                id="",
                job=command.job,
                action=policy_action(command) or command.verb,
                command=command.dumps(),
                text=command.text(),
                requester=req.user,
                groups=flow.groups,
                channel=req.channel,
                surface=req.surface,
                actor=req.actor,
                created_at=now,
                expires_at=now + settings.expires,
                patches=await digests(self.ctx.config, command),
            )
        )
        files = await attachments(self.ctx.config, request)
        await self._show(request, request_reply(self.ctx.config, request, files))
        await self.audit(
            req, AuditOutcome.AWAITING, command, detail=words.approval_record(request), run_id=request.id
        )
        self.spawn(self._expire_at(request), f"pitstop-approval:{request.id}")
        return waiting_reply(self.ctx.config, request)

    async def _show(self, request: ApprovalRequest, reply: Reply) -> None:
        """The request's message (the run's, ``run:r-N``), posted or updated in place."""
        channel = self.ctx.config.channel_for(request.job) if request.job in self.ctx.config.jobs else None
        try:
            await self.ctx.outbox.announce(f"run:{request.id}", reply, channel or request.channel)
        except Exception:
            log.warning("could not show approval request %s", request.id, exc_info=True)

    async def _decide(self, flow: Flow, call_next: Next) -> Reply:
        """``approve r-N`` / ``deny r-N [reason]`` (typed or clicked): the rules, then the first
        decision wins.  Who decides is checked with their user groups read fresh, and an approval
        re-authorises the requester with theirs (a requester who lost the role closes it unrun);
        groups that cannot be read fresh refuse the decision (:class:`GroupsUnknown`)."""
        command, req, user = flow.run, flow.req, flow.req.user
        assert command is not None and command.run_ref is not None
        request = await self.approvals.find(command.run_ref)
        if request is None:
            raise ParseError(words.approval_not_request(command.run_ref))
        approving, asked = command.verb == "approve", Command.loads(request.command)
        settings = self.ctx.config.jobs[request.job].approval if request.job in self.ctx.config.jobs else None
        pending, refusal, lost = request.state is ApprovalState.PENDING, None, ""
        own = user in (request.requester, request.real_requester)
        if pending and approving and own:
            refusal = words.approval_self(request.id)
        elif pending and (approving or not own):  # the requester may withdraw their own
            groups = await fresh_groups(self.ctx, user)
            if not may_approve(self.ctx.config, request, user, groups):
                refusal = words.approval_not_approver(
                    user, request.id, settings.approvers if settings else []
                )
        if refusal is None and approving and pending:
            try:  # the requester's role, as it is now: requests live for days
                authorise(
                    self.ctx.config, asked, request.requester, await fresh_groups(self.ctx, request.requester)
                )
            except Denied as exc:
                lost = words.requester_lost_role(request.requester, exc.message)
            if asked.spec.acts and not lost:
                # a restart in flight would refuse it: the request stays open for after it, not spent
                holder = await self.ctx.service.locks.holder(scope_of(self.ctx.config, request.job))
                if holder is not None:
                    raise InFlight(request.job, holder)
        if refusal is None:
            state = (
                ApprovalState.REFUSED
                if lost
                else ApprovalState.APPROVED
                if approving
                else ApprovalState.DENIED
            )
            decided, request = await self.approvals.decide(
                request.id, state, "" if lost else user, lost or command.reason or "", decider=req.actor
            )
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
        if lost:
            return refused(words.approval_refused(request.id, lost), ExitCode.DENIED)
        if not approving:
            return Reply(title=words.approval_denied_ack(request.id), status=Status.INFO, ephemeral=True)
        flow.run = asked
        flow.on_behalf = Request.acting(
            request.actor,
            request.text,
            request.requester,
            request.groups,
            req.delivery_id,
            request.channel,
            request.surface,
        )
        flow.approval, flow.outcome = request, AuditOutcome.ACCEPTED
        try:
            return await call_next()
        except InFlight:  # another restart took the lock after the check: the approval is not spent
            reopened = await self.approvals.reopen(request.id, user)
            if reopened is not None:
                await self._show(reopened, request_reply(self.ctx.config, reopened))
            raise

    async def _closed(self, request: ApprovalRequest, req: Request) -> None:
        """A request just decided or expired: its record in the audit trail (as the command it asked
        for, so ``history JOB`` finds it), its message without buttons."""
        outcome = {
            ApprovalState.APPROVED: AuditOutcome.APPROVED,
            ApprovalState.DENIED: AuditOutcome.REJECTED,
            ApprovalState.REFUSED: AuditOutcome.DENIED,
        }.get(request.state, AuditOutcome.EXPIRED)
        asked = Command.loads(request.command)
        await self.audit(req, outcome, asked, detail=words.approval_record(request), run_id=request.id)
        await self._show(request, closed_reply(self.ctx.config, request))

    async def _expire_at(self, request: ApprovalRequest) -> None:
        await asyncio.sleep(max(0.0, request.expires_at - time.time()))
        await self.expire(request.id)

    async def expire(self, request_id: str) -> bool:
        """Close ``request_id`` as expired if it is still pending (its message loses its buttons);
        True if this call closed it."""
        decided, request = await self.approvals.decide(request_id, ApprovalState.EXPIRED)
        if decided is not Decided.WON:
            return False
        req = Request.acting(
            request.actor,
            request.text,
            request.requester,
            request.groups,
            None,
            request.channel,
            request.surface,
        )
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
