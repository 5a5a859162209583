"""The one path every request takes, from any surface: parse → dedupe → authorise → confirm → act.

:class:`Dispatcher` is the middleware-like step (Bolt's ``async_process``, errbot's
``cmdfilter``): the cross-cutting rules — exactly-once delivery, roles, confirmation and the
audit trail — live here once, before any verb's handler runs.  Every request ends in one audit
record (accepted, denied, refused, invalid, failed, error, duplicate, pending, confirmed,
cancelled, forced) and one :class:`~handlers.reply.Reply` whose ``exit_code`` the CLI uses.

It answers fast: restart/start/stop take the lock, create and announce the run, and continue
in a tracked background task (:func:`handlers.sequences.run_sequence`); reads do their remote
work inline.  An expected failure (:class:`~pipeline.errors.PitstopError`) is shown as its
message; anything else is logged with its traceback and answered with an incident id.

Usage::

    dispatcher = Dispatcher(ctx)
    reply = await dispatcher.handle(Request("restart dflash with topk patch", user="U012AB"))
    await dispatcher.drain(60)
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from handlers.audit import Audit, AuditOutcome
from handlers.auth import SYSTEM_SURFACE, SYSTEM_USER, Denied, authorise
from handlers.commands import Command, ParseError, parse
from handlers.confirm import DEFAULT_WINDOW, Confirmations, Pending, Take
from handlers.context import Context
from handlers.dedupe import Dedupe
from handlers.lock import DEFAULT_TTL, InFlight
from handlers.reply import Button, Reply, Status
from handlers.sequences import begin_sequence, cancel_command, run_sequence
from pipeline import messages
from pipeline.errors import ExitCode, PitstopError, internal_error, new_incident_id

log = logging.getLogger(__name__)

_RUN_ID = re.compile(r"r-[0-9]+\Z")


@dataclass(frozen=True)
class Request:
    """One request from a surface, already stripped of its transport.

    :ivar text: what the person typed (Slack markup is normalised by the parser).
    :ivar user: the requester's Slack user id (or the console's ``--as`` id).
    :ivar groups: the requester's Slack user-group ids (for ``[auth]``).
    :ivar delivery_id: the delivery's id (event id, trigger id) for exactly-once; None = no dedupe.
    :ivar channel: the channel the request came from.
    :ivar surface: ``slack`` | ``console`` | ``say`` | ``home`` ….
    """

    text: str
    user: str
    groups: tuple[str, ...] = ()
    delivery_id: str | None = None
    channel: str | None = None
    surface: str = "slack"


def _error_reply(exc: PitstopError, *, ephemeral: bool) -> Reply:
    head, *rest = exc.message.splitlines() or [""]
    tone = Status.WARNING if isinstance(exc, InFlight) else Status.ERROR
    return Reply(title=head, lines=tuple(rest), status=tone, ephemeral=ephemeral, exit_code=exc.exit_code)


def _internal_reply(incident: str) -> Reply:
    return Reply(
        title=internal_error(incident),
        status=Status.ERROR,
        ephemeral=True,
        exit_code=ExitCode.FAILED,
    )


class Dispatcher:
    """Parse, deduplicate, authorise, confirm, act and audit — for every surface.

    :param ctx: the process's shared parts.
    :param lock_ttl: seconds a restart lock lives without renewal (renewed every ``ttl / 3``).
    :param confirm_window: seconds a confirmation waits for its requester.
    """

    def __init__(
        self, ctx: Context, *, lock_ttl: float = DEFAULT_TTL, confirm_window: float = DEFAULT_WINDOW
    ) -> None:
        self.ctx = ctx
        self.lock_ttl = lock_ttl
        self.confirm_window = confirm_window
        client, prefix = ctx.redis.client, ctx.prefix
        self.audit = Audit(client, prefix)
        self.dedupe = Dedupe(client, prefix)
        self.confirmations = Confirmations(client, prefix)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.Task[Any]] = set()

    # --- background work ------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], *, name: str, timer: bool = False) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        bucket = self._timers if timer else self._tasks
        bucket.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._timers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    @property
    def in_flight(self) -> int:
        """Background sequences still running in this process."""
        return len(self._tasks)

    async def drain(self, timeout: float) -> None:
        """Wait for background sequences (at most ``timeout`` s), then cancel what is left,
        including pending confirmation timers (their Redis records expire by themselves)."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        timers = set(self._timers)
        for task in timers:
            task.cancel()
        if timers:
            await asyncio.wait(timers, timeout=5.0)

    async def seen(self, delivery_id: str | None) -> bool:
        """True when ``delivery_id`` was already acted on (for surfaces deciding whether to answer a retry)."""
        return bool(delivery_id) and await self.dedupe.seen(str(delivery_id))

    # --- the audit step -------------------------------------------------------------------------

    async def _audit(
        self,
        req: Request,
        outcome: AuditOutcome,
        command: Command | None = None,
        *,
        detail: str = "",
        run_id: str | None = None,
    ) -> None:
        try:
            await self.audit.record(
                user=req.user,
                text=req.text,
                outcome=outcome,
                surface=req.surface,
                channel=req.channel,
                verb=command.verb if command else "",
                job=command.job if command else None,
                command=command.dumps() if command else "",
                detail=detail,
                run_id=run_id,
            )
        except Exception:  # the answer matters more than its record; the log keeps it
            log.exception("could not write the audit record for %r (%s)", req.text, outcome.value)

    # --- requests --------------------------------------------------------------------------------

    async def handle(self, req: Request) -> Reply:
        """Answer one request; never raises (except cancellation).

        :returns: the reply for the requester; ``exit_code`` 0 ok, 1 failed, 2 bad input,
            3 denied, 4 in flight, 5 cancelled.
        """
        command: Command | None = None
        try:
            try:
                command = parse(req.text, self.ctx.config)
            except ParseError as exc:
                await self._audit(req, AuditOutcome.INVALID, detail=exc.message)
                return _error_reply(exc, ephemeral=True)
            if req.delivery_id and not await self.dedupe.claim(req.delivery_id, self.ctx.instance):
                await self._audit(req, AuditOutcome.DUPLICATE, command)
                return Reply(title=messages.duplicate_delivery(), status=Status.INFO, ephemeral=True)
            system = req.surface == SYSTEM_SURFACE and req.user == SYSTEM_USER
            authorise(self.ctx.config, command, req.user, req.groups, system=system)
            # a job's opt-in auto_restart is its standing confirmation: nobody could click for it
            if (
                command.spec.acts
                and command.job is not None
                and self.ctx.config.jobs[command.job].confirm
                and not system
            ):
                return await self._ask(req, command)
            return await self._act_and_audit(req, command, AuditOutcome.ACCEPTED)
        except asyncio.CancelledError:
            raise
        except PitstopError as exc:
            return await self._failed(req, command, exc)
        except Exception:
            return await self._internal(req, command)

    async def _failed(self, req: Request, command: Command | None, exc: PitstopError) -> Reply:
        if isinstance(exc, Denied):
            outcome = AuditOutcome.DENIED
        elif isinstance(exc, InFlight):
            outcome = AuditOutcome.REFUSED
        else:
            outcome = AuditOutcome.FAILED
        await self._audit(req, outcome, command, detail=exc.message)
        ephemeral = isinstance(exc, Denied | InFlight | ParseError)
        return _error_reply(exc, ephemeral=ephemeral)

    async def _internal(self, req: Request, command: Command | None) -> Reply:
        incident = new_incident_id()
        log.exception("incident %s: request %r from %s", incident, req.text, req.user)
        await self._audit(req, AuditOutcome.ERROR, command, detail=f"incident {incident}")
        return _internal_reply(incident)

    async def _act_and_audit(self, req: Request, command: Command, outcome: AuditOutcome) -> Reply:
        reply, audited = await self._act(req, command)
        if reply.exit_code is not ExitCode.OK and outcome is AuditOutcome.ACCEPTED:
            audited = AuditOutcome.FAILED
        await self._audit(req, audited or outcome, command, detail=reply.title, run_id=reply.run_id)
        return reply

    async def _act(self, req: Request, command: Command) -> tuple[Reply, AuditOutcome | None]:
        """Run the verb's handler.

        :returns: the reply and, when it differs from the caller's, the outcome to audit.
        """
        from handlers import views

        ctx, verb, job = self.ctx, command.verb, command.job
        if verb in ("restart", "start", "stop"):
            run, lock, channel = await begin_sequence(
                ctx, command, req.user, req.channel, lock_ttl=self.lock_ttl
            )
            self._spawn(run_sequence(ctx, run, command, lock, channel), name=f"pitstop-{verb}:{run.id}")
            reply = Reply(
                title=messages.queued(run.id, run.job),
                lines=(messages.queued_detail(verb, channel),),
                status=Status.INFO,
                run_id=run.id,
                thread_key=f"run:{run.id}",
            )
            return reply, None
        if verb == "cancel":
            assert job is not None
            return await cancel_command(ctx, job, req.user), None
        if verb == "status":
            return await views.status_command(ctx, job), None
        if verb == "logs":
            assert job is not None
            return await views.logs_command(ctx, job, command.lines), None
        if verb == "patches":
            assert job is not None
            return await views.patches_command(ctx, job), None
        if verb == "lock":
            assert job is not None
            return await views.lock_command(ctx, job), None
        if verb == "unlock":
            assert job is not None
            reply, holder = await views.unlock_command(ctx, job, req.user)
            return reply, AuditOutcome.FORCED if holder is not None else None
        if verb == "history":
            return await views.history_command(ctx, self.audit, job, command.count), None
        if verb == "help":
            return views.help_command(ctx.config, command), None
        return await self._delegated(req, command), None

    async def _delegated(self, req: Request, command: Command) -> Reply:
        """digest, gpus (handlers.reports) and watch, ack (handlers.watching), imported lazily."""
        ctx, verb = self.ctx, command.verb
        module = "handlers.reports" if verb in ("digest", "gpus") else "handlers.watching"
        try:
            if verb == "digest":
                from handlers.reports import digest_command

                return await digest_command(ctx, command.job)
            if verb == "gpus":
                from handlers.reports import gpus_command

                assert command.host is not None
                return await gpus_command(ctx, command.host)
            if verb == "watch":
                from handlers.watching import watch_command

                assert command.job is not None and command.state is not None
                return await watch_command(ctx, command.job, command.state, command.for_s, req.user)
            if verb == "ack":
                from handlers.watching import ack_command

                assert command.job is not None
                return await ack_command(ctx, command.job, req.user)
        except ImportError:
            log.exception("verb %s unavailable", verb)
            return Reply(
                title=messages.verb_unavailable(verb, module), status=Status.ERROR, exit_code=ExitCode.FAILED
            )
        raise AssertionError(f"no handler for verb {verb!r}")  # the grammar and this table disagree

    # --- confirmation --------------------------------------------------------------------------

    async def _ask(self, req: Request, command: Command) -> Reply:
        pending = await self.confirmations.add(
            user=req.user,
            groups=req.groups,
            text=command.text(),
            command=command.dumps(),
            channel=req.channel,
            surface=req.surface,
            window=self.confirm_window,
        )
        await self._audit(req, AuditOutcome.PENDING, command, detail=f"confirmation {pending.token}")
        self._spawn(self._expire(pending), name=f"pitstop-confirm:{pending.token}", timer=True)
        assert command.job is not None
        return Reply(
            title=messages.confirm_ask(command.text(), command.job, self.confirm_window),
            status=Status.WARNING,
            ephemeral=True,
            buttons=(
                Button(messages.confirm_button(), "confirm", pending.token, "primary"),
                Button(messages.cancel_button(), "cancel", pending.token, "danger"),
            ),
        )

    async def _expire(self, pending: Pending) -> None:
        await asyncio.sleep(pending.window)
        taken, found = await self.confirmations.take(pending.token, None)
        if taken is not Take.TAKEN or found is None:
            return
        req = Request(found.text, found.user, found.groups, None, found.channel, found.surface)
        command = Command.from_json(_loads(found.command))
        text = messages.confirm_expired(found.text, found.window)
        await self._audit(req, AuditOutcome.CANCELLED, command, detail=text)
        reply = Reply(title=text, status=Status.WARNING, ephemeral=True, exit_code=ExitCode.CANCELLED)
        try:  # privately, replacing the prompt where the surface can: no public post, no live buttons
            await self.ctx.outbox.tell(found.user, reply, pending.token)
        except Exception:
            log.warning("could not post the expiry of confirmation %s", pending.token, exc_info=True)

    async def handle_action(
        self,
        action: str,
        value: str,
        user: str,
        delivery_id: str | None = None,
        groups: tuple[str, ...] = (),
    ) -> Reply:
        """Answer a button: ``confirm``/``cancel`` (value: a confirmation token, or a run id to
        cancel that run), ``show_log`` (value: a job).  Never raises (except cancellation).

        :param user: who clicked.
        :param delivery_id: the click's id (a double click arrives twice with the same id).
        :param groups: the user groups of who clicked (roles may name groups, as for typed commands).
        """
        req = Request(
            text=f"[{action}] {value}", user=user, groups=groups, delivery_id=delivery_id, surface="action"
        )
        command: Command | None = None
        try:
            if delivery_id and not await self.dedupe.claim(delivery_id, self.ctx.instance):
                await self._audit(req, AuditOutcome.DUPLICATE)
                return Reply(title=messages.duplicate_delivery(), status=Status.INFO, ephemeral=True)
            if action == "show_log":
                command = parse(f"logs {value}", self.ctx.config)
                authorise(self.ctx.config, command, user, groups)
                return await self._act_and_audit(req, command, AuditOutcome.ACCEPTED)
            if action == "cancel" and _RUN_ID.match(value):
                run = await self.ctx.runs.get(value)
                command = Command("cancel", job=run.job)
                authorise(self.ctx.config, command, user, groups)
                return await self._act_and_audit(req, command, AuditOutcome.ACCEPTED)
            if action in ("confirm", "cancel"):
                return await self._settle(req, action, value, user)
            await self._audit(req, AuditOutcome.INVALID, detail=messages.unknown_action(action))
            return Reply(
                title=messages.unknown_action(action),
                status=Status.ERROR,
                ephemeral=True,
                exit_code=ExitCode.USAGE,
            )
        except asyncio.CancelledError:
            raise
        except PitstopError as exc:
            return await self._failed(req, command, exc)
        except Exception:
            return await self._internal(req, command)

    async def _settle(self, req: Request, action: str, token: str, user: str) -> Reply:
        taken, pending = await self.confirmations.take(token, user)
        if taken is Take.GONE or pending is None:
            await self._audit(req, AuditOutcome.CANCELLED, detail=messages.confirm_gone())
            return Reply(
                title=messages.confirm_gone(),
                status=Status.WARNING,
                ephemeral=True,
                exit_code=ExitCode.CANCELLED,
            )
        command = Command.from_json(_loads(pending.command))
        original = Request(
            pending.text, user, pending.groups, req.delivery_id, pending.channel, pending.surface
        )
        if taken is Take.NOT_YOURS:
            text = messages.confirm_not_yours(pending.user)
            await self._audit(req, AuditOutcome.DENIED, command, detail=text)
            return Reply(title=text, status=Status.ERROR, ephemeral=True, exit_code=ExitCode.DENIED)
        if taken is Take.EXPIRED:
            text = messages.confirm_expired(pending.text, pending.window)
            await self._audit(original, AuditOutcome.CANCELLED, command, detail=text)
            return Reply(title=text, status=Status.WARNING, ephemeral=True, exit_code=ExitCode.CANCELLED)
        if action == "cancel":
            text = messages.confirm_cancelled(pending.text, user)
            await self._audit(original, AuditOutcome.CANCELLED, command, detail=text)
            return Reply(title=text, status=Status.INFO, ephemeral=True, exit_code=ExitCode.CANCELLED)
        authorise(self.ctx.config, command, user, req.groups or pending.groups)  # roles may have changed
        return await self._act_and_audit(original, command, AuditOutcome.CONFIRMED)


def _loads(raw: str) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("a stored command is not a JSON object")
    return data
