"""Who may do what: one check before any handler runs.

Each verb needs a role (:attr:`handlers.grammar.parse.VerbSpec.role`).  A person holds a role when
``[auth]`` lists their Slack user id, one of their user-group ids, or ``"*"``; for a command about
a job, each list its ``[jobs.NAME.auth]`` sets replaces the global one.  The console and ``pitstop
say`` act as the Slack id ``[auth.cli]`` maps their OS user to (:mod:`bot.console.identity`), with
only the roles the config gives it.  ``approve``, ``deny`` and ``--break-glass`` are done only as
oneself, proven (:func:`own_act`); approvals read user groups fresh (:func:`fresh_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence

from handlers.context import Context
from handlers.grammar.commands import Command
from handlers.grammar.parse import Role
from handlers.text import denied, impersonated, unproven_actor
from pipeline.config import Config, JobAuth
from pipeline.errors import ExitCode, GroupsUnknown, PitstopError
from pipeline.state.audit import Actor

EVERYONE = "*"
#: The principal of the watcher's automatic restarts (:class:`handlers.watch.cycle.Watcher`): an operator
#: for every job, through the same lock, posts and audit as a person.  It counts only for requests
#: from :data:`SYSTEM_SURFACE` (built in-process), so no Slack user nor ``--as pitstop-auto`` can claim it.
SYSTEM_USER = "pitstop-auto"
SYSTEM_SURFACE = "scheduler"  #: the only surface whose requests may act as :data:`SYSTEM_USER`
SYSTEM_ROLE = Role.OPERATOR  #: what the system principal may do (restart, never unlock)


class Denied(PitstopError):
    """The requester lacks the role (at least ``needed``) the command needs; the message names both."""

    code = "denied"
    exit_code = ExitCode.DENIED

    def __init__(self, user: str, command: Command, needed: Role) -> None:
        super().__init__(denied(user, command.verb, command.job or command.host, needed.label))


class NotYourself(Denied):
    """``approve``, ``deny`` or ``--break-glass`` from a requester not proven to be themselves: a CLI
    or console without ``[auth.cli]``, or ``--as`` someone else; the message says how to fix it."""

    code = "not_yourself"

    def __init__(self, message: str) -> None:
        PitstopError.__init__(self, message)


def own_act(actor: Actor, verb: str) -> None:
    """Check that ``actor`` may do ``verb`` (``approve``, ``deny``, ``--break-glass``), which are done
    only as oneself, proven: in Slack, or in the CLI and console with ``[auth.cli]`` and no ``--as``.

    :raises NotYourself: if the surface does not prove who they are, or they act ``--as`` someone.
    """
    if not actor.proven:
        raise NotYourself(unproven_actor(verb, actor.os_user))
    if actor.by:
        raise NotYourself(impersonated(verb, actor.by, actor.user))


def names_groups(config: Config) -> bool:
    """True when a role list (global or per job) or ``[approval] approvers`` names a group (``S…``)."""
    ids: list[str] = [*config.auth.admins, *config.auth.operators, *config.auth.viewers]
    for job in config.jobs.values():
        ids += [*(job.auth.admins or []), *(job.auth.operators or []), *(job.auth.viewers or [])]
        ids += job.approval.approvers if job.approval is not None else []
    return any(i.startswith("S") for i in ids)


async def fresh_groups(ctx: Context, user: str) -> tuple[str, ...]:
    """The user groups ``user`` is in now, read through the context's directory: what an approval
    trusts (the requester's and the approver's), never a stale listing.

    :raises GroupsUnknown: if they cannot be read fresh, or this surface reads none while the config
        names groups.
    """
    if ctx.directory is not None:
        return await ctx.directory.fresh_groups(user)
    if names_groups(ctx.config):
        raise GroupsUnknown(None, surface="this surface")
    return ()


def role_of(config: Config, user: str, groups: Sequence[str] = (), job: str | None = None) -> Role | None:
    """The highest role ``user`` (a member of ``groups``) holds, for ``job`` (its
    ``[jobs.NAME.auth]`` overrides) if given; None when the config gives them none."""
    ids, a = {user, *groups, EVERYONE}, config.auth
    own = config.jobs[job].auth if job is not None and job in config.jobs else JobAuth()
    lists = (
        (Role.ADMIN, own.admins, a.admins),
        (Role.OPERATOR, own.operators, a.operators),
        (Role.VIEWER, own.viewers, a.viewers),
    )
    return next((role for role, mine, every in lists if ids & set(every if mine is None else mine)), None)


def authorise(
    config: Config, command: Command, user: str, groups: Sequence[str] = (), *, system: bool = False
) -> Role:
    """The role ``user`` holds, checked to cover what ``command`` needs.

    :param system: the request is Pitstop's own (as :data:`SYSTEM_USER`): it holds
        :data:`SYSTEM_ROLE` whatever the config says.
    :raises Denied: if they hold no role, or a lesser one than the verb needs.
    """
    needed = command.spec.role
    held = SYSTEM_ROLE if system and user == SYSTEM_USER else role_of(config, user, groups, command.job)
    if held is None or held < needed:
        raise Denied(user, command, needed)
    return held
