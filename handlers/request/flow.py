"""One request on its way through the dispatcher's steps (:class:`Request`, :class:`Flow`) and the
callables they share: a leaf of :mod:`handlers.request.dispatch`, :mod:`handlers.approval.twoperson` and :mod:`handlers.request.verbs`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from handlers.grammar.commands import Command
from handlers.reply import Reply
from pipeline.state.approvals import ApprovalRequest
from pipeline.state.audit import AuditOutcome


@dataclass(frozen=True)
class Request:
    """One request from a surface, already stripped of its transport."""

    text: str  #: what the person typed (Slack markup is normalised by the parser)
    user: str  #: the requester's Slack user id (or the console's ``--as`` id)
    groups: tuple[str, ...] = ()  #: the requester's Slack user-group ids (for ``[auth]``)
    delivery_id: str | None = None  #: event id, trigger id … for exactly-once; None = no dedupe
    channel: str | None = None
    surface: str = "slack"  #: ``slack`` | ``console`` | ``say`` | ``home`` …


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
