"""The two-person rule as people meet it: which requests wait, who may decide them, what they are shown.

A job's ``[jobs.NAME.approval]`` (:class:`~pipeline.config.ApprovalSettings`) lists the actions
that wait for a second person (:func:`approval_for`); :func:`may_approve` is the right to decide.
The requester never approves their own request (checked here and again by the store's script).
The state lives in :mod:`pipeline.state.approvals`; the step that uses these rules is
:mod:`handlers.approval.twoperson`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence

from handlers.grammar.commands import Command
from handlers.grammar.parse import Role
from handlers.reply import Attachment, Button, Reply, Status, mention
from handlers.request.auth import role_of
from handlers.text import APPROVE_BUTTON, DENY_BUTTON
from pipeline import fmt
from pipeline.config import ApprovalSettings, Config
from pipeline.config.approval import APPROVER_ROLES
from pipeline.engines.workdir import patch_digest, patch_text
from pipeline.errors import ExitCode, PitstopError
from pipeline.fmt import who
from pipeline.state.approvals import ApprovalRequest, ApprovalState, PatchDigest

HASH_SHOWN = 12  #: hex digits of a SHA-256 shown in text (the whole hash is in the record)


def policy_action(command: Command) -> str | None:
    """The command's action in ``[jobs.NAME.approval] actions`` words (a restart that applies or
    reverts a patch is ``restart_with_patch``), or None for a verb no policy can hold (reads, ``approve``)."""
    if command.verb == "restart":
        return "restart_with_patch" if command.patches or command.without else "restart"
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
            raise PitstopError(approval_unreadable(name, str(paths[name]), str(exc))) from None
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
        title=approval_waiting_title(request.id, request.text, request.requester),
        status=Status.WARNING,
        lines=_waiting_lines(config, request),
        buttons=(
            Button(APPROVE_BUTTON, "approve", request.id, "primary"),
            Button(DENY_BUTTON, "deny", request.id, "danger"),
        ),
        attachments=files,
        thread_key=f"run:{request.id}",
    )


def closed_reply(config: Config, request: ApprovalRequest) -> Reply:
    """The request's message once decided or expired: the same facts, a line saying how it ended, no buttons."""
    if request.state is ApprovalState.APPROVED:
        head, tone = approval_approved(request.id, request.decided_by), Status.OK
    elif request.state is ApprovalState.DENIED:
        head, tone = approval_denied(request.id, request.decided_by, request.reason), Status.ERROR
    else:
        head, tone = approval_expired(request.id, request.expires_at - request.created_at), Status.WARNING
    return Reply(
        title=head,
        status=tone,
        lines=(approval_waiting_title(request.id, request.text, request.requester), *_patch_lines(request)),
        thread_key=f"run:{request.id}",
    )


def waiting_reply(config: Config, request: ApprovalRequest) -> Reply:
    """The requester's answer: it waits (exit code :attr:`ExitCode.AWAITING_APPROVAL`)."""
    return Reply(
        title=approval_asked(request.id, request.text),
        status=Status.WARNING,
        lines=_waiting_lines(config, request),
        ephemeral=True,
        thread_key=f"run:{request.id}",
        exit_code=ExitCode.AWAITING_APPROVAL,
    )


def pending_reply(config: Config, requests: Sequence[ApprovalRequest], job: str | None) -> Reply:
    """``pending [JOB]``: every request still waiting, oldest first."""
    if not requests:
        return Reply(title=pending_none(job), status=Status.INFO)
    lines = []
    for r in requests:
        hashes = ", ".join(f"{p.name} {p.sha256[:HASH_SHOWN]}" for p in r.patches) or "no patch"
        left = fmt.duration(max(0.0, r.expires_at - time.time()))
        lines.append(pending_line(r.id, r.text, r.requester, hashes, left))
    return Reply(title=pending_title(len(requests)), lines=tuple(lines), status=Status.INFO)


def hashes_text(request: ApprovalRequest) -> str:
    """``topk sha256 1a2b3c4d5e6f`` for each patch, for the audit trail and ``history``."""
    return ", ".join(f"{p.name} sha256 {p.sha256[:HASH_SHOWN]}" for p in request.patches) or "no patch"


def _patch_lines(request: ApprovalRequest) -> list[str]:
    return [
        line
        for p in request.patches
        for line in (approval_patch(p.name, p.sha256, p.size), *(f"    {d}" for d in p.diffstat))
    ]


def _waiting_lines(config: Config, request: ApprovalRequest) -> tuple[str, ...]:
    settings = config.jobs[request.job].approval
    approvers = settings.approvers if settings is not None else []
    expires = fmt.clock(request.expires_at, config.scheduler.timezone)
    return (*_patch_lines(request), approval_who(approvers), approval_expires(expires))


def approver_names(approvers: Sequence[str]) -> str:
    """``admins, <@U012AB>, <!subteam^S0ONCALL>``: who may approve, as the message shows them."""
    return ", ".join(f"{a}s" if a in APPROVER_ROLES else mention(a) for a in approvers)


# --- text ---------------------------------------------------------------------------------------


def approval_waiting_title(request_id: str, text: str, requester: str) -> str:
    """The run's message while its request waits."""
    return f"{request_id}: `{text}` by {who(requester)} is waiting for approval"


def approval_asked(request_id: str, text: str) -> str:
    """The requester's answer."""
    return f"{request_id}: `{text}` waits for a second person's approval - nothing was done yet"


def approval_patch(name: str, sha256: str, size: int) -> str:
    """One patch under review: its name, hash and size (the whole diff is attached)."""
    return f"patch {name}: sha256 {sha256[:HASH_SHOWN]}… ({fmt.size(size)}; whole diff attached)"


def approval_who(approvers: Sequence[str]) -> str:
    """Who may click Approve/Deny."""
    return f"may approve: {approver_names(approvers)} (not the requester)"


def approval_expires(when: str) -> str:
    """When the request closes by itself."""
    return f"closes unapproved at {when}"


def approval_approved(request_id: str, by: str) -> str:
    """The request was approved; the run follows in this message."""
    return f"{request_id}: approved by {who(by)} - running"


def approval_denied(request_id: str, by: str, reason: str) -> str:
    """The request was denied."""
    why = f": {reason}" if reason else ""
    return f"{request_id}: denied by {who(by)}{why} - nothing was done"


def approval_expired(request_id: str, seconds: float) -> str:
    """Nobody decided in time."""
    return f"{request_id}: expired after {fmt.duration(seconds)} without a decision - nothing was done"


def approval_self(request_id: str) -> str:
    """The requester clicked Approve on their own request."""
    return f"you asked for {request_id}, so you cannot approve it - a second person must"


def approval_not_approver(user: str, request_id: str, approvers: Sequence[str]) -> str:
    """Someone without the right clicked Approve or Deny."""
    return f"{who(user)} may not decide {request_id} - approvers: {approver_names(approvers)}"


def approval_already(request_id: str, state: str, by: str) -> str:
    """A decision came after another one (the first decision wins)."""
    whom = f" by {who(by)}" if by else ""
    return f"{request_id} was already {state}{whom} - nothing was done"


def approval_not_request(request_id: str) -> str:
    """``approve r-N`` for a run that was never a request."""
    return f"{request_id} is not a request waiting for approval (see `pending`)"


def approval_unreadable(name: str, path: str, error: str) -> str:
    """A patch under review cannot be read: nothing can be shown, so nothing is asked."""
    return f"cannot read patch {name} ({path}): {error} - nothing was asked or done"


def approval_denied_ack(request_id: str) -> str:
    """The denier's answer."""
    return f"{request_id} denied - the requester sees it in the run's message"


def approval_record(request: ApprovalRequest) -> str:
    """The audit detail of a decision: requester, decision, hashes (``history`` shows it)."""
    base = f"{request.id} {request.state.value}: `{request.text}` asked by {request.requester}"
    by = f", {request.state.value} by {request.decided_by}" if request.decided_by else ""
    why = f" ({request.reason})" if request.reason else ""
    return f"{base}{by}{why}; {hashes_text(request)}"


def break_glass_announce(user: str, text: str, reason: str) -> str:
    """An admin acted without approval: said in the channel."""
    return f"break glass: {who(user)} ran `{text}` without approval - reason: {reason}"


def break_glass_note(reason: str) -> str:
    """After the queued run's headline (and so in its audit record): it runs without approval."""
    return f" - break glass, without approval: {reason}"


def pending_title(n: int) -> str:
    """``pending``'s headline."""
    return f"{n} request{'s' if n != 1 else ''} waiting for approval"


def pending_none(job: str | None) -> str:
    """``pending`` with nothing waiting."""
    return f"nothing waiting for approval{f' for {job}' if job else ''}"


def pending_line(request_id: str, text: str, requester: str, hashes: str, left: str) -> str:
    """One waiting request."""
    return f"{request_id}: `{text}` by {who(requester)} · {hashes} · closes in {left}"
