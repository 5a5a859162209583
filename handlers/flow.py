"""One request on its way through the dispatcher's steps: the request as a surface hands it in,
and what each step learnt of it (:class:`Flow`).  A leaf the steps' modules share
(:mod:`handlers.dispatch`, :mod:`handlers.twoperson`); :mod:`handlers.dispatch` re-exports both."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from handlers.commands import Command
from handlers.reply import Reply
from pipeline.state.approvals import ApprovalRequest
from pipeline.state.audit import AuditOutcome


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


@dataclass
class Flow:
    """One request on its way through the steps; each step may fill in what it learnt.

    :ivar req: the request as received (failures are audited against it).
    :ivar action: the button's action (``confirm``, ``cancel``, ``show_log``), None for typed text.
    :ivar value: the button's value (a token, a run id, a job).
    :ivar command: the command known so far (failures are audited with it).
    :ivar run: the command the verb's handler runs (a confirmation's stored command).
    :ivar on_behalf: the request the handler acts and is audited for (default: ``req``).
    :ivar outcome: the audit outcome when the handler succeeds (accepted, confirmed).
    :ivar user: who is authorised.
    :ivar groups: their user groups.
    :ivar system: the system principal (automatic restarts): its own role, never asked to confirm.
    :ivar approval: the approved request the handler runs (the two-person rule), or None.
    :ivar break_glass: an admin's reason for acting without approval, or None.
    """

    req: Request
    action: str | None = None
    value: str = ""
    command: Command | None = None
    run: Command | None = None
    on_behalf: Request | None = None
    outcome: AuditOutcome = AuditOutcome.ACCEPTED
    user: str = ""
    groups: tuple[str, ...] = ()
    system: bool = False
    approval: ApprovalRequest | None = None
    break_glass: str | None = None


Next = Callable[[], Awaitable[Reply]]
"""Calls the rest of the steps (and then the handler)."""

Step = Callable[[Flow, Next], Awaitable[Reply]]
"""A cross-cutting step: answers by itself or returns ``await call_next()``."""
