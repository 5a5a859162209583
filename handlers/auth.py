"""Who may do what: one check before any handler runs.

Each verb needs a role (:attr:`handlers.grammar.VerbSpec.role`); roles nest (admin ⊇
operator ⊇ viewer).  A person holds a role when ``[auth]`` lists their Slack user id, one of
their user-group ids, or ``"*"``.  For a command about a job, each list the job sets in
``[jobs.NAME.auth]`` replaces the global list of that role for that job.  The console and
``pitstop say`` user (``console`` unless ``--as``/``PITSTOP_USER``) is just another id: it
has only the roles the config gives it.
"""

from __future__ import annotations

from collections.abc import Sequence

from handlers.commands import Command
from handlers.grammar import Role
from handlers.reply import who
from pipeline.config import Config
from pipeline.errors import ExitCode, PitstopError

EVERYONE = "*"
#: The principal Pitstop's own scheduler acts as (automatic restarts by the watcher,
#: ``handlers.watching.AUTO_USER``): an operator for every job, so its restarts go through the
#: same lock, posts and audit as a person's.  Slack ids (``U…``/``W…``/``S…``) never take this
#: form, and it counts only for requests the dispatcher got from :data:`SYSTEM_SURFACE` (built
#: in-process by the scheduler), so neither a Slack user nor ``--as pitstop-auto`` can claim it.
SYSTEM_USER = "pitstop-auto"
SYSTEM_SURFACE = "scheduler"  #: the only surface whose requests may act as :data:`SYSTEM_USER`
SYSTEM_ROLE = Role.OPERATOR  #: what the system principal may do (restart, never unlock)


class Denied(PitstopError):
    """The requester lacks the role the command needs.

    :param user: the requester's id.
    :param command: what they asked for.
    :param needed: the least role that may do it.
    """

    code = "denied"
    exit_code = ExitCode.DENIED

    def __init__(self, user: str, command: Command, needed: Role) -> None:
        self.user = user
        self.command = command
        self.needed = needed
        super().__init__(denied(user, command.verb, command.job or command.host, needed.label))


def _lists(config: Config, job: str | None) -> dict[Role, list[str]]:
    a = config.auth
    lists = {Role.ADMIN: a.admins, Role.OPERATOR: a.operators, Role.VIEWER: a.viewers}
    if job is not None and job in config.jobs:
        own = config.jobs[job].auth
        overrides = {Role.ADMIN: own.admins, Role.OPERATOR: own.operators, Role.VIEWER: own.viewers}
        lists.update({role: value for role, value in overrides.items() if value is not None})
    return lists


def role_of(config: Config, user: str, groups: Sequence[str] = (), job: str | None = None) -> Role | None:
    """The highest role ``user`` (a member of ``groups``) holds, for ``job`` if given.

    :param user: a Slack user id (or the console's id).
    :param groups: the user's Slack user-group ids.
    :param job: the job's configured name, for its ``[jobs.NAME.auth]`` overrides.
    :returns: the role, or None when the config gives them none.
    """
    ids = {user, *groups, EVERYONE}
    lists = _lists(config, job)
    return next((role for role in (Role.ADMIN, Role.OPERATOR, Role.VIEWER) if ids & set(lists[role])), None)


def authorise(
    config: Config, command: Command, user: str, groups: Sequence[str] = (), *, system: bool = False
) -> Role:
    """Check that ``user`` may run ``command``.

    :param system: the request is Pitstop's own (an automatic restart from the scheduler,
        as :data:`SYSTEM_USER`): it holds :data:`SYSTEM_ROLE` whatever the config says.
    :returns: the role they hold (at least the one needed).
    :raises Denied: if they hold no role, or a lesser one than the verb needs.
    """
    needed = command.spec.role
    held = SYSTEM_ROLE if system and user == SYSTEM_USER else role_of(config, user, groups, command.job)
    if held is None or held < needed:
        raise Denied(user, command, needed)
    return held


# --- text ---------------------------------------------------------------------------------------


def denied(user: str, verb: str, job: str | None, role: str) -> str:
    """A request refused for lack of a role."""
    target = f" {job}" if job else ""
    return (
        f"{who(user)} may not `{verb}{target}` - it needs the {role} role "
        "(roles come from [auth] in the config, or [jobs.NAME.auth] for one job)"
    )
