"""The one path every request takes, from any surface: parse → dedupe → authorise → confirm → approval → act.

:class:`Dispatcher` runs a typed command (:meth:`Dispatcher.handle`) or a button
(:meth:`Dispatcher.handle_action`) through one list of middleware-like steps
(:attr:`Dispatcher.steps`, as Bolt's ``async_process(req, resp, next)``), then the verb's handler
(:data:`handlers.request.verbs.VERBS`); a cross-cutting rule is a step, not an ``if`` in each path.  Every
request ends in one audit record and one :class:`~handlers.reply.Reply` whose ``exit_code`` the CLI
uses.  restart/start/stop continue in a tracked background task; reads work inline.  An expected
failure (:class:`~pipeline.errors.PitstopError`) is shown as its message; anything else is logged
with its traceback and answered with an incident id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Coroutine
from functools import partial
from typing import Any

from handlers import text as words
from handlers.approval.twoperson import TwoPersonRule
from handlers.context import Context
from handlers.grammar.commands import Command, ParseError, parse
from handlers.reply import Button, Reply, Status, refused
from handlers.request.auth import SYSTEM_SURFACE, SYSTEM_USER, Denied, NotYourself, authorise
from handlers.request.flow import Flow, Next, Request, Step
from handlers.request.verbs import VERBS, Acted, Call
from handlers.views.nodes import resolve_node
from pipeline.errors import ExitCode, GroupsUnknown, PitstopError, internal_error, new_incident_id
from pipeline.state.approvals import DEFAULT_WINDOW, Confirmations, Pending, Take
from pipeline.state.audit import Audit, AuditEntry, AuditOutcome
from pipeline.state.deliveries import Deliveries
from pipeline.state.locks import DEFAULT_TTL, InFlight

__all__ = ["Dispatcher", "Flow", "Request"]

log = logging.getLogger(__name__)

_RUN_ID = re.compile(r"r-[0-9]+\Z")
#: how an expected failure is audited (any other: ``failed``)
_OUTCOMES = {
    Denied: AuditOutcome.DENIED,
    NotYourself: AuditOutcome.DENIED,
    GroupsUnknown: AuditOutcome.DENIED,
    InFlight: AuditOutcome.REFUSED,
    ParseError: AuditOutcome.INVALID,
}


def _error_reply(exc: PitstopError) -> Reply:
    head, *rest = exc.message.splitlines() or [""]
    tone = Status.WARNING if isinstance(exc, InFlight) else Status.ERROR
    ephemeral = isinstance(exc, Denied | InFlight | ParseError)
    return Reply(title=head, lines=tuple(rest), status=tone, ephemeral=ephemeral, exit_code=exc.exit_code)


class Dispatcher:
    """Parse, deduplicate, authorise, confirm, act and audit — for every surface, as one list of steps.

    :param lock_ttl: seconds a restart lock lives without renewal (renewed every ``ttl / 3``).
    :param confirm_window: seconds a confirmation waits for its requester.
    """

    def __init__(
        self, ctx: Context, *, lock_ttl: float = DEFAULT_TTL, confirm_window: float = DEFAULT_WINDOW
    ) -> None:
        self.ctx = ctx
        self.lock_ttl = lock_ttl
        self.confirm_window = confirm_window
        self.audit = ctx.redis.open_store(Audit)
        self.deliveries = ctx.redis.open_store(Deliveries)
        self.confirmations = ctx.redis.open_store(Confirmations)
        #: the two-person rule's step (:mod:`handlers.approval.twoperson`)
        self.two_person = TwoPersonRule(ctx, self._audit, partial(self._spawn, timer=True))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.Task[Any]] = set()
        #: the cross-cutting steps every request runs, in order, before the verb's handler
        self.steps: tuple[Step, ...] = (
            self._guard,
            self._parse,
            self._dedupe,
            self._resolve,
            self._authorise,
            self._confirm,
            self.two_person.step,
        )

    # --- background work ------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, timer: bool = False) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        (self._timers if timer else self._tasks).add(task)
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
        pending = set(self._tasks)
        if pending:
            _done, pending = await asyncio.wait(pending, timeout=timeout)
        for left in (pending, self._timers):  # the timers as they are once the tasks are cancelled
            left = set(left)
            for task in left:
                task.cancel()
            if left:
                await asyncio.wait(left, timeout=5.0)

    async def seen(self, delivery_id: str | None) -> bool:
        """True when ``delivery_id`` was already acted on (for surfaces deciding whether to answer a retry)."""
        return bool(delivery_id) and await self.deliveries.seen(str(delivery_id))

    async def _audit(
        self,
        req: Request,
        outcome: AuditOutcome,
        command: Command | None = None,
        *,
        detail: str = "",
        run_id: str | None = None,
    ) -> None:
        asked: dict[str, Any] = (
            {"verb": command.verb, "job": command.job, "command": command.dumps()} if command else {}
        )
        try:
            await self.audit.record(
                AuditEntry(
                    user=req.user,
                    text=req.text,
                    outcome=outcome,
                    surface=req.surface,
                    channel=req.channel or "",
                    detail=detail,
                    run_id=run_id or "",
                    by=req.by,
                    os_user=req.os_user,
                    **asked,
                )
            )
        except Exception:  # the answer matters more than its record; the log keeps it
            log.exception("could not write the audit record for %r (%s)", req.text, outcome.value)

    # --- requests: every one runs the same steps ---------------------------------------------------

    async def handle(self, req: Request) -> Reply:
        """Answer one typed request; never raises (except cancellation).  The reply's ``exit_code``:
        0 ok, 1 failed, 2 bad input, 3 denied, 4 in flight, 5 cancelled."""
        system = req.surface == SYSTEM_SURFACE and req.user == SYSTEM_USER
        return await self._run(Flow(req, groups=req.groups, system=system))

    async def handle_action(
        self,
        action: str,
        value: str,
        user: str,
        delivery_id: str | None = None,
        groups: tuple[str, ...] = (),
        *,
        via: Request | None = None,
    ) -> Reply:
        """Answer a button: ``confirm``/``cancel`` (value: a confirmation token, or a run id to
        cancel that run), ``show_log`` (value: a job).  Never raises (except cancellation).

        :param delivery_id: the click's id (a double click arrives twice with the same id).
        :param groups: the user groups of who clicked (roles may name groups, as for typed commands).
        :param via: a request of the session that answers (the console's, ``pitstop say``'s): the
            click is its actor's, through its surface; None: a Slack click (surface ``action``).
        """
        text = f"[{action}] {value}"
        req = (
            Request(text, user, groups, delivery_id, surface="action")
            if via is None
            else dataclasses.replace(via, text=text, user=user, groups=groups, delivery_id=delivery_id)
        )
        return await self._run(Flow(req, action=action, value=value, groups=groups))

    async def _run(self, flow: Flow) -> Reply:
        """Pass ``flow`` through :attr:`steps`, each calling the next, then to the verb's handler."""

        async def at(i: int) -> Reply:
            if i == len(self.steps):
                return await self._act(flow)
            return await self.steps[i](flow, lambda: at(i + 1))

        return await at(0)

    # --- the steps, in order ------------------------------------------------------------------------

    async def _guard(self, flow: Flow, call_next: Next) -> Reply:
        """Turn what the later steps raise into a reply and its audit record."""
        try:
            return await call_next()
        except asyncio.CancelledError:
            raise
        except PitstopError as exc:
            outcome = _OUTCOMES.get(type(exc), AuditOutcome.FAILED)
            await self._audit(flow.req, outcome, flow.command, detail=exc.message)
            return _error_reply(exc)
        except Exception:
            incident = new_incident_id()
            log.exception("incident %s: request %r from %s", incident, flow.req.text, flow.req.user)
            await self._audit(flow.req, AuditOutcome.ERROR, flow.command, detail=f"incident {incident}")
            return refused(internal_error(incident), ExitCode.FAILED)

    async def _parse(self, flow: Flow, call_next: Next) -> Reply:
        """Typed text → a :class:`Command` (buttons carry no text: they are resolved after dedupe);
        :class:`ParseError` if it is not one."""
        if flow.action is None:
            flow.command = flow.run = parse(flow.req.text, self.ctx.config)
        return await call_next()

    async def _dedupe(self, flow: Flow, call_next: Next) -> Reply:
        """Act on a delivery once: a retry of one already claimed is answered, not acted on."""
        req = flow.req
        if req.delivery_id and not await self.deliveries.claim(req.delivery_id, self.ctx.instance):
            await self._audit(req, AuditOutcome.DUPLICATE, flow.command)
            return Reply(title=words.DUPLICATE_DELIVERY, status=Status.INFO, ephemeral=True, redelivery=True)
        return await call_next()

    async def _resolve(self, flow: Flow, call_next: Next) -> Reply:
        """A button → the command it stands for; a node verb without its job → the job of the one
        cluster that has the node (:func:`~handlers.views.nodes.resolve_node`); other typed commands
        pass as they are."""
        action, value = flow.action, flow.value
        if action == "show_log":
            flow.command = flow.run = parse(f"logs {value}", self.ctx.config)
        elif action == "cancel" and _RUN_ID.match(value):
            flow.command = flow.run = Command("cancel", job=(await self.ctx.runs.get(value)).job)
        elif action in ("confirm", "cancel"):
            return await self._settle(flow, call_next)
        elif action in ("approve", "deny") and _RUN_ID.match(value):
            flow.command = flow.run = Command(action, options={"run": value})
        elif action is not None:
            raise ParseError(words.unknown_action(action))
        if flow.run is not None and flow.run.node is not None:  # a node verb: the cluster that has it
            flow.command = flow.run = await resolve_node(self.ctx, flow.run)
        return await call_next()

    async def _authorise(self, flow: Flow, call_next: Next) -> Reply:
        """The requester's role must cover the verb's (:func:`handlers.request.auth.authorise` raises)."""
        assert flow.run is not None
        authorise(self.ctx.config, flow.run, flow.req.user, flow.groups, system=flow.system)
        return await call_next()

    async def _confirm(self, flow: Flow, call_next: Next) -> Reply:
        """Ask first when the verb changes a job whose config wants confirmation."""
        command = flow.run
        assert command is not None
        # a job's opt-in auto_restart is its standing confirmation: nobody could click for it
        if (
            flow.outcome is AuditOutcome.ACCEPTED
            and command.spec.acts
            and command.job is not None
            and self.ctx.config.jobs[command.job].confirm
            and not flow.system
        ):
            return await self._ask(flow.req, command)
        return await call_next()

    async def _act(self, flow: Flow) -> Reply:
        """Run the verb's handler (:data:`handlers.request.verbs.VERBS`) and audit what came of it."""
        req, command = flow.on_behalf or flow.req, flow.run
        assert command is not None
        call = Call(
            self.ctx, command, req, self.audit, self.lock_ttl, self._spawn, flow.approval, flow.break_glass
        )
        answer = await VERBS[command.verb](call)
        reply, audited = answer if isinstance(answer, Acted) else (answer, None)
        if reply.exit_code is not ExitCode.OK and flow.outcome is AuditOutcome.ACCEPTED:
            audited = AuditOutcome.FAILED
        await self._audit(req, audited or flow.outcome, command, detail=reply.title, run_id=reply.run_id)
        return reply

    # --- confirmation --------------------------------------------------------------------------

    async def _ask(self, req: Request, command: Command) -> Reply:
        pending = await self.confirmations.add(
            Pending(
                user=req.user,
                groups=req.groups,
                text=command.text(),
                command=command.dumps(),
                channel=req.channel,
                surface=req.surface,
                window=self.confirm_window,
                actor=req.actor,
            )
        )
        await self._audit(req, AuditOutcome.PENDING, command, detail=f"confirmation {pending.token}")
        self._spawn(self._expire(pending), f"pitstop-confirm:{pending.token}", timer=True)
        assert command.job is not None
        return Reply(
            title=words.confirm_ask(command.text(), command.job, self.confirm_window),
            status=Status.WARNING,
            ephemeral=True,
            buttons=(
                Button(words.CONFIRM_BUTTON, "confirm", pending.token, "primary"),
                Button(words.CANCEL_BUTTON, "cancel", pending.token, "danger"),
            ),
        )

    async def _expire(self, pending: Pending) -> None:
        await asyncio.sleep(pending.window)
        taken, found = await self.confirmations.take(pending.token, None)
        if taken is not Take.TAKEN or found is None:
            return
        req = Request.acting(
            found.actor, found.text, found.user, found.groups, None, found.channel, found.surface
        )
        command = Command.loads(found.command)
        text = words.confirm_expired(found.text, found.window)
        await self._audit(req, AuditOutcome.CANCELLED, command, detail=text)
        reply = refused(text, ExitCode.CANCELLED, Status.WARNING)
        try:  # privately, replacing the prompt where the surface can: no public post, no live buttons
            await self.ctx.outbox.tell(found.user, reply, pending.token)
        except Exception:
            log.warning("could not post the expiry of confirmation %s", pending.token, exc_info=True)

    async def _settle(self, flow: Flow, call_next: Next) -> Reply:
        """A click on a confirmation: end it here, or pass its stored command on, confirmed."""
        req, action, token, user = flow.req, flow.action, flow.value, flow.req.user
        taken, pending = await self.confirmations.take(token, user)
        if taken is Take.GONE or pending is None:
            await self._audit(req, AuditOutcome.CANCELLED, detail=words.CONFIRM_GONE)
            return refused(words.CONFIRM_GONE, ExitCode.CANCELLED, Status.WARNING)
        command = Command.loads(pending.command)
        original = Request.acting(
            pending.actor,
            pending.text,
            user,
            pending.groups,
            req.delivery_id,
            pending.channel,
            pending.surface,
        )
        if taken is Take.NOT_YOURS:
            text = words.confirm_not_yours(pending.user)
            await self._audit(req, AuditOutcome.DENIED, command, detail=text)
            return refused(text, ExitCode.DENIED)
        if taken is Take.EXPIRED or action == "cancel":
            expired = taken is Take.EXPIRED
            text = (
                words.confirm_expired(pending.text, pending.window)
                if expired
                else words.confirm_cancelled(pending.text, user)
            )
            await self._audit(original, AuditOutcome.CANCELLED, command, detail=text)
            return refused(text, ExitCode.CANCELLED, Status.WARNING if expired else Status.INFO)
        # roles may have changed since the request: authorised again, as who clicked
        flow.run, flow.on_behalf, flow.outcome = command, original, AuditOutcome.CONFIRMED
        flow.groups = req.groups or pending.groups
        return await call_next()
