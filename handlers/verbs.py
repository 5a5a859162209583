"""The verb table: each verb's grammar entry (formats, usage, role) and the handler that answers it.

:data:`VERBS` maps a verb to one :class:`Verb` — its :class:`~handlers.grammar.VerbSpec` (what
the parser accepts, the usage and ``help`` text, the least role) beside the handler that runs
once the cross-cutting steps of :class:`~handlers.dispatch.Dispatcher` (parse, dedupe,
authorise, confirm) have passed it.  Adding a verb is one :class:`~handlers.grammar.VerbSpec`
in :data:`handlers.grammar.GRAMMAR` and one row here; the table refuses to build when the two
disagree.

The specs themselves stay in :mod:`handlers.grammar`, a leaf the parser imports without the
handlers' remote machinery (``pitstop parse`` stays quick, and no handler module imports back
into this table).

Usage::

    acted = await VERBS["status"].handler(Call(ctx, Command("status"), user="U012AB", ...))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from handlers import acks, approval, grammar, reports, views
from handlers.attempts import attempts_command, no_progress_warning
from handlers.auth import SYSTEM_USER
from handlers.commands import Command
from handlers.context import Context
from handlers.grammar import VerbSpec
from handlers.reply import Reply, Status
from handlers.sequences import begin_sequence, cancel_command, run_sequence
from pipeline.state.approvals import ApprovalRequest, Approvals
from pipeline.state.audit import Audit, AuditOutcome

Spawn = Callable[[Coroutine[Any, Any, Any], str], object]
"""Starts background work tracked by the dispatcher: ``spawn(coroutine, task_name)``."""


@dataclass(frozen=True)
class Call:
    """What a verb's handler is given once the request passed every cross-cutting step.

    :ivar ctx: the process's shared parts.
    :ivar command: the parsed, authorised (and, where needed, confirmed) command.
    :ivar user: who the command acts for (audited as such).
    :ivar channel: the channel the request came from, or None.
    :ivar audit: the dispatcher's audit trail (``history`` reads it).
    :ivar lock_ttl: seconds a restart lock lives without renewal.
    :ivar spawn: starts a background task the dispatcher tracks (restart/start/stop sequences).
    :ivar surface: where the request came from (``slack``, ``home``, ``console``, ``say`` …).
    :ivar approval: the approved request this command runs under the two-person rule, or None.
    :ivar break_glass: an admin's reason for acting without approval, or None.
    """

    ctx: Context
    command: Command
    user: str
    channel: str | None
    audit: Audit
    lock_ttl: float
    spawn: Spawn
    surface: str = "slack"
    approval: ApprovalRequest | None = None
    break_glass: str | None = None


class Acted(NamedTuple):
    """A handler's answer: the reply and, when it differs from the dispatcher's, the outcome to audit."""

    reply: Reply
    outcome: AuditOutcome | None = None


Handler = Callable[[Call], Awaitable[Acted]]


@dataclass(frozen=True)
class Verb:
    """One row of the table.

    :ivar spec: the grammar entry: formats, usage, role, ``help`` text.
    :ivar handler: answers a command of this verb.
    """

    spec: VerbSpec
    handler: Handler

    @property
    def name(self) -> str:
        """The canonical verb."""
        return self.spec.name


# --- the handlers, one per verb ------------------------------------------------------------------


async def _sequence(call: Call) -> Acted:
    """restart, start, stop: take the lock, create and announce the run, continue in the background."""
    ctx, command, granted = call.ctx, call.command, call.approval
    run, lock, channel = await begin_sequence(
        ctx,
        command,
        call.user,
        call.channel,
        lock_ttl=call.lock_ttl,
        approval=granted,
        break_glass=call.break_glass,
    )
    if call.break_glass is not None:  # said in the channel before anything is touched
        text = approval.break_glass_announce(call.user, command.text(), call.break_glass)
        await ctx.outbox.post(Reply(title=text, status=Status.WARNING, run_id=run.id), channel)
    call.spawn(run_sequence(ctx, run, command, lock, channel), f"pitstop-{command.verb}:{run.id}")
    warned = None
    if command.verb in ("restart", "start") and call.user != SYSTEM_USER:
        warned = await no_progress_warning(ctx, run.job)  # a person's restart is warned, never blocked
    reply = Reply(
        title=queued(run.id, run.job)
        + (approval.break_glass_note(call.break_glass) if call.break_glass else ""),
        lines=(queued_detail(command.verb, channel), *((warned,) if warned else ())),
        status=Status.INFO,
        run_id=run.id,
        thread_key=f"run:{run.id}",
    )
    return Acted(reply)


def _job(call: Call) -> str:
    job = call.command.job
    assert job is not None  # the verb's formats require a job
    return job


async def _cancel(call: Call) -> Acted:
    return Acted(await cancel_command(call.ctx, _job(call), call.user))


async def _status(call: Call) -> Acted:
    return Acted(await views.status_command(call.ctx, call.command.job))


async def _logs(call: Call) -> Acted:
    return Acted(await views.logs_command(call.ctx, _job(call), call.command.lines))


async def _digest(call: Call) -> Acted:
    return Acted(await reports.digest_command(call.ctx, call.command.job))


async def _history(call: Call) -> Acted:
    if call.command.attempts:
        return Acted(await attempts_command(call.ctx, call.command.job, call.command.count))
    return Acted(await views.history_command(call.ctx, call.audit, call.command.job, call.command.count))


async def _patches(call: Call) -> Acted:
    return Acted(await views.patches_command(call.ctx, _job(call)))


async def _lock(call: Call) -> Acted:
    return Acted(await views.lock_command(call.ctx, _job(call)))


async def _unlock(call: Call) -> Acted:
    reply, holder = await views.unlock_command(call.ctx, _job(call), call.user)
    return Acted(reply, AuditOutcome.FORCED if holder is not None else None)


async def _watch(call: Call) -> Acted:
    command = call.command
    assert command.state is not None  # the format requires on|off
    return Acted(await acks.watch_command(call.ctx, _job(call), command.state, command.for_s, call.user))


async def _ack(call: Call) -> Acted:
    return Acted(await acks.ack_command(call.ctx, _job(call), call.user))


async def _gpus(call: Call) -> Acted:
    host = call.command.host
    assert host is not None  # the format requires a host
    return Acted(await reports.gpus_command(call.ctx, host))


async def _approve(call: Call) -> Acted:
    # the two-person rule's step decided it and, when approved, ran the request's own command
    raise AssertionError("approve and deny are answered by handlers.twoperson")


async def _pending(call: Call) -> Acted:
    requests = await call.ctx.redis.open_store(Approvals).pending(call.command.job)
    return Acted(approval.pending_reply(call.ctx.config, requests, call.command.job))


async def _help(call: Call) -> Acted:
    # in Slack a verb is typed after the slash command; in the console and `pitstop say` alone
    typed = f"{call.ctx.config.slack.command} " if call.surface in ("slack", "home") else ""
    return Acted(views.help_command(call.command, typed=typed))


# --- the table -----------------------------------------------------------------------------------


def _table(*rows: tuple[str, Handler]) -> Mapping[str, Verb]:
    """The rows in :data:`handlers.grammar.GRAMMAR` order.

    :raises ValueError: if a row names no verb of the grammar, or a verb of the grammar has no row.
    """
    handlers = dict(rows)
    missing = [spec.name for spec in grammar.GRAMMAR if spec.name not in handlers]
    unknown = [name for name in handlers if name not in grammar.VERBS]
    if missing or unknown or len(handlers) != len(rows):
        raise ValueError(f"verb table and grammar disagree: no handler {missing}, no grammar {unknown}")
    return MappingProxyType({spec.name: Verb(spec, handlers[spec.name]) for spec in grammar.GRAMMAR})


VERBS: Mapping[str, Verb] = _table(
    ("restart", _sequence),
    ("start", _sequence),
    ("stop", _sequence),
    ("cancel", _cancel),
    ("status", _status),
    ("logs", _logs),
    ("digest", _digest),
    ("history", _history),
    ("patches", _patches),
    ("lock", _lock),
    ("unlock", _unlock),
    ("approve", _approve),
    ("deny", _approve),
    ("pending", _pending),
    ("watch", _watch),
    ("ack", _ack),
    ("gpus", _gpus),
    ("help", _help),
)
"""verb → its grammar entry and handler, read-only, in ``help`` order."""


# --- text ---------------------------------------------------------------------------------------


def queued(run_id: str, job: str) -> str:
    """The quick answer to restart/start/stop: the run is under way."""
    return f"queued run {run_id} for {job}"


def queued_detail(action: str, channel: str | None) -> str:
    """Where the run's steps will appear."""
    where = f" in <#{channel}>" if channel else ""
    return f"the {action} runs step by step{where}; the verified result follows in its thread"
