"""The verb table: the handler that answers each verb of the grammar.

:data:`VERBS` maps each verb of :data:`handlers.grammar.parse.GRAMMAR` to the handler the dispatcher
runs once its steps have passed the request; the module refuses to load when the two disagree.  The specs stay in :mod:`handlers.grammar.parse`, a leaf the parser imports
without the handlers' remote machinery (``pitstop parse`` stays quick).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from handlers import text as words
from handlers.approval import twoperson as approval
from handlers.context import Context
from handlers.grammar import parse as grammar
from handlers.grammar.commands import Command
from handlers.reply import Reply, Status
from handlers.request.auth import SYSTEM_USER
from handlers.request.flow import Request, Spawn
from handlers.runs.view import thread_key
from handlers.views import nodes, reports
from handlers.views import read as views
from handlers.watch import acks, escalate
from handlers.watch.suspects import excluding, suspect_nodes
from pipeline.errors import ExitCode
from pipeline.state.approvals import ApprovalRequest, Approvals
from pipeline.state.audit import Audit, AuditOutcome


@dataclass(frozen=True)
class Call:
    """What a verb's handler is given once the request passed every cross-cutting step."""

    ctx: Context
    command: Command  #: parsed, authorised (and, where needed, confirmed)
    req: Request  #: the request the command acts and is audited for (its user, channel, surface)
    audit: Audit  #: the dispatcher's audit trail (``history`` reads it)
    lock_ttl: float  #: seconds a restart lock lives without renewal
    spawn: Spawn  #: restart/start/stop sequences run as tasks the dispatcher tracks
    approval: ApprovalRequest | None = None  #: the approved request run under the two-person rule
    break_glass: str | None = None  #: an admin's reason for acting without approval


class Acted(NamedTuple):
    """A handler's answer: the reply and, when it differs from the dispatcher's, the outcome to audit."""

    reply: Reply
    outcome: AuditOutcome | None = None


#: a verb's handler: its reply, or an :class:`Acted` when the outcome to audit differs
Handler = Callable[[Call], Awaitable[Reply | Acted]]


async def _sequence(call: Call) -> Reply:
    """restart, start, stop: take the lock, create and announce the run, continue in the background."""
    ctx, command, user, glass = call.ctx, call.command, call.req.user, call.break_glass
    job = _job(call)
    warned: tuple[str, ...] = ()
    if command.verb in ("restart", "start") and user != SYSTEM_USER:  # warned, never blocked
        suspects = await suspect_nodes(ctx, job, time.time())
        said = (await ctx.service.no_progress_warning(job), excluding(job, suspects, command.exclude))
        warned = tuple(w for w in said if w)
    run = await ctx.service.request(
        job,
        command.verb,
        user,
        lock_ttl=call.lock_ttl,
        patches=command.patches,
        fresh_cache=command.fresh_cache,
        exclude=command.exclude,
        from_step=command.from_step,
        auto=user == SYSTEM_USER,
        approval=call.approval,
        break_glass=glass,
        actor=call.req.actor,
    )
    channel = ctx.config.channel_for(job) or call.req.channel
    if glass is not None:  # said in the channel before anything is touched
        text = words.break_glass_announce(call.req.actor, command.text(), glass)
        await ctx.outbox.post(Reply(title=text, status=Status.WARNING, run_id=run.id), channel)
    ctx.posts.show(run, channel)
    call.spawn(ctx.service.execute(run, remove=command.without), f"pitstop-{command.verb}:{run.id}")
    return Reply(
        title=words.queued(run.id, run.job) + (words.break_glass_note(glass) if glass else ""),
        lines=(words.queued_detail(command.verb, channel), *warned),
        status=Status.INFO,
        run_id=run.id,
        thread_key=thread_key(run.id),
    )


async def _cancel(call: Call) -> Reply:
    """``cancel JOB``: ask the job's in-flight sequence to stop at its next step boundary (exit 1 if none)."""
    job = _job(call)
    run_id = await call.ctx.service.cancel(job, call.req.user)
    if run_id is None:
        return Reply(title=words.cancel_nothing(job), status=Status.WARNING, exit_code=ExitCode.FAILED)
    title = words.cancel_requested(run_id, job)
    return Reply(title=title, status=Status.INFO, run_id=run_id, thread_key=thread_key(run_id))


def _job(call: Call) -> str:
    assert call.command.job is not None  # the verb's format requires a job
    return call.command.job


async def _unlock(call: Call) -> Acted:
    reply, holder = await views.unlock_command(call.ctx, _job(call), call.req.user)
    return Acted(reply, AuditOutcome.FORCED if holder is not None else None)


async def _approve(call: Call) -> Acted:
    # the two-person rule's step decided it and, when approved, ran the request's own command
    raise AssertionError("approve and deny are answered by handlers.approval.twoperson")


async def _pending(call: Call) -> Reply:
    requests = await call.ctx.redis.open_store(Approvals).pending(call.command.job)
    return approval.pending_reply(call.ctx.config, requests, call.command.job)


async def _help(call: Call) -> Reply:
    # in Slack a verb is typed after the slash command; in the console and `pitstop say` alone
    typed = f"{call.ctx.config.slack.command} " if call.req.surface in ("slack", "home") else ""
    return views.help_command(call.command, typed=typed, jobs=list(call.ctx.config.jobs))


VERBS: Mapping[str, Handler] = MappingProxyType(
    {
        "restart": _sequence,
        "start": _sequence,
        "stop": _sequence,
        "cancel": _cancel,
        "status": lambda c: views.status_command(c.ctx, c.command.job),
        "logs": lambda c: views.logs_command(c.ctx, _job(c), c.command.lines),
        "digest": lambda c: reports.digest_command(c.ctx, c.command.job),
        "history": lambda c: (
            views.attempts_command(c.ctx, c.command.job, c.command.count)
            if c.command.attempts
            else views.history_command(c.ctx, c.audit, c.command.job, c.command.count)
        ),
        "follow": lambda c: views.follow_command(c.ctx, c.command.run_ref or ""),
        "patches": lambda c: views.patches_command(c.ctx, _job(c)),
        "checkpoints": lambda c: views.checkpoints_command(c.ctx, _job(c)),
        "lock": lambda c: views.lock_command(c.ctx, _job(c)),
        "unlock": _unlock,
        "approve": _approve,
        "deny": _approve,
        "pending": _pending,
        "watch": lambda c: acks.watch_command(
            c.ctx, _job(c), c.command.state or "", c.command.for_s, c.req.user
        ),
        "ack": lambda c: acks.ack_command(c.ctx, _job(c), c.req.user),
        "maintenance": lambda c: acks.maintenance_command(
            c.ctx, _job(c), c.command.for_s or 0, c.command.reason, c.req.user
        ),
        "oncall": lambda c: escalate.oncall_command(c.ctx),
        "gpus": lambda c: reports.gpus_command(c.ctx, c.command.host or ""),
        "nodes": lambda c: nodes.nodes_command(c.ctx, c.command.job, c.command.host),
        "drain": lambda c: nodes.node_command(c.ctx, c.command, c.req.user),
        "undrain": lambda c: nodes.node_command(c.ctx, c.command, c.req.user),
        "help": _help,
    }
)
"""verb → its handler, read-only."""
if VERBS.keys() != grammar.VERBS.keys():
    raise ValueError(f"verb table and grammar disagree: {sorted(VERBS.keys() ^ grammar.VERBS.keys())}")
