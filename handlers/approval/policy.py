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

from handlers import text as words
from handlers.grammar.commands import Command
from handlers.grammar.parse import Role
from handlers.reply import Attachment, Button, Reply, Status
from handlers.request.auth import role_of
from pipeline import fmt
from pipeline.config import ApprovalSettings, Config
from pipeline.config.approval import APPROVER_ROLES
from pipeline.engines.workdir import patch_digest, patch_text
from pipeline.errors import ExitCode, PitstopError
from pipeline.state.approvals import ApprovalRequest, ApprovalState, PatchDigest


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
        title=words.approval_waiting_title(request.id, request.text, request.requester),
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
    else:
        waited = request.expires_at - request.created_at
        head, tone = words.approval_expired(request.id, waited), Status.WARNING
    asked = words.approval_waiting_title(request.id, request.text, request.requester)
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
