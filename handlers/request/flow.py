"""One request on its way through the dispatcher's steps (:class:`Request`, :class:`Flow`) and the
callables they share: a leaf of :mod:`handlers.request.dispatch`, :mod:`handlers.approval.twoperson` and :mod:`handlers.request.verbs`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from handlers.grammar.commands import Command
from handlers.reply import Reply
from pipeline.state.approvals import ApprovalRequest
from pipeline.state.audit import Actor, AuditOutcome


@dataclass(frozen=True)
class Request:
    """One request from a surface, already stripped of its transport, with who is acting as the
    surface proved it (:class:`~pipeline.state.audit.Actor`: Slack's signed user id; the CLI's OS
    user mapped by ``[auth.cli]``)."""

    text: str  #: what the person typed (Slack markup is normalised by the parser)
    user: str  #: the Slack user id acted as (the CLI's mapped id, or its ``--as`` id)
    groups: tuple[str, ...] = ()  #: the requester's Slack user-group ids (for ``[auth]``)
    delivery_id: str | None = None  #: event id, trigger id … for exactly-once; None = no dedupe
    channel: str | None = None
    surface: str = "slack"  #: ``slack`` | ``console`` | ``say`` | ``home`` …
    by: str = ""  #: the real actor's Slack id when acting for ``user`` (an admin's ``--as``)
    os_user: str = ""  #: the OS user running the CLI or console ("" in Slack)
    proven: bool = True  #: False: a CLI or console without ``[auth.cli]`` (nothing proves ``user``)

    @property
    def actor(self) -> Actor:
        """Who is acting, through which surface (kept on runs, approvals and audit records)."""
        return Actor(
            user=self.user, surface=self.surface, by=self.by, os_user=self.os_user, proven=self.proven
        )

    @classmethod
    def acting(
        cls,
        actor: Actor | None,
        text: str,
        user: str,
        groups: tuple[str, ...] = (),
        delivery_id: str | None = None,
        channel: str | None = None,
        surface: str = "slack",
    ) -> Request:
        """A request made again from a stored one (a confirmation, an approval request): ``actor`` as
        recorded (None, for an older record: ``user`` through ``surface``, unproven)."""
        if actor is None:
            return cls(text, user, groups, delivery_id, channel, surface, proven=False)
        return cls(
            text,
            actor.user,
            groups,
            delivery_id,
            channel,
            actor.surface,
            actor.by,
            actor.os_user,
            actor.proven,
        )


@dataclass
class Flow:
    """One request on its way through the steps; each step may fill in what it learnt."""

    req: Request  #: as received (failures are audited against it)
    action: str | None = None  #: the button's action (``confirm``, ``cancel``, ``show_log``); None: typed
    value: str = ""  #: the button's value (a token, a run id, a job)
    command: Command | None = None  #: the command known so far (failures are audited with it)
    run: Command | None = None  #: the command the verb's handler runs (a confirmation's stored one)
    on_behalf: Request | None = None  #: the request acted and audited for (default: ``req``)
    outcome: AuditOutcome = AuditOutcome.ACCEPTED  #: audited when the handler succeeds
    groups: tuple[str, ...] = ()  #: the user groups of who is authorised (``req.user``)
    system: bool = False  #: the system principal (automatic restarts): never asked to confirm
    approval: ApprovalRequest | None = None  #: the approved request run (the two-person rule)
    break_glass: str | None = None  #: an admin's reason for acting without approval


Next = Callable[[], Awaitable[Reply]]
"""Calls the rest of the steps (and then the handler)."""

Step = Callable[[Flow, Next], Awaitable[Reply]]
"""A cross-cutting step: answers by itself or returns ``await call_next()``."""

Spawn = Callable[[Coroutine[Any, Any, Any], str], object]
"""Starts a task the dispatcher tracks (and cancels at drain): ``spawn(coroutine, task_name)``."""
