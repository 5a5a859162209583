"""Who the CLI and console act as, as far as the machine proves it.

Slack signs each request with the user's id; a terminal proves only the OS user running Pitstop.
``[auth.cli]`` maps OS users to Slack ids: with it, ``pitstop say`` and ``pitstop console`` act as
the OS user's own id, and ``--as`` (or ``PITSTOP_USER``) is honoured for an admin only, recorded as
"admin as user".  Without it, ``--as`` acts as today, unproven: ``approve``, ``deny`` and
``--break-glass`` are then refused (:func:`handlers.request.auth.own_act`).
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.text import cli_as_refused, cli_unmapped
from handlers.grammar.parse import Role
from handlers.request.auth import role_of
from handlers.request.flow import Request
from pipeline.config import Config
from pipeline.errors import ExitCode, PitstopError

DEFAULT_USER = "console"  #: who an unmapped CLI acts as without ``--as``/``PITSTOP_USER``


class IdentityRefused(PitstopError, code="identity_refused", exit_code=ExitCode.DENIED):
    """The CLI or console will not act: the OS user is not in ``[auth.cli]``, or asked ``--as``
    someone without being an admin; the message says what to do."""


@dataclass(frozen=True)
class CliIdentity:
    """Who a CLI or console session acts as."""

    user: str  #: the Slack id acted as
    os_user: str  #: the OS user running Pitstop
    by: str = ""  #: the admin's own mapped id when acting ``--as`` someone else
    proven: bool = False  #: ``[auth.cli]`` maps ``os_user``: approve, deny and break glass are allowed

    def request(self, text: str, delivery_id: str, surface: str) -> Request:
        """A request typed in this session (``surface``: ``console`` or ``say``)."""
        return Request(
            text,
            self.user,
            delivery_id=delivery_id,
            surface=surface,
            by=self.by,
            os_user=self.os_user,
            proven=self.proven,
        )


def cli_identity(config: Config, os_user: str, explicit: str | None = None) -> CliIdentity:
    """Who the CLI or console acts as, run by ``os_user``.

    :param explicit: ``--as`` (else ``PITSTOP_USER``), None if neither.
    :returns: without ``[auth.cli]``: ``explicit`` (default ``console``), unproven; with it: the OS
        user's mapped id, or ``explicit`` acted for by that id when it is an admin's.
    :raises IdentityRefused: if ``[auth.cli]`` does not map ``os_user``, or maps it to a non-admin
        who asked ``--as`` someone else.
    """
    mapping = config.auth.cli
    if not mapping:
        return CliIdentity(explicit or DEFAULT_USER, os_user)
    mine = mapping.get(os_user)
    if mine is None:
        raise IdentityRefused(cli_unmapped(os_user, config.source))
    if explicit is None or explicit == mine:
        return CliIdentity(mine, os_user, proven=True)
    if role_of(config, mine) is not Role.ADMIN:
        raise IdentityRefused(cli_as_refused(os_user, mine, explicit))
    return CliIdentity(explicit, os_user, by=mine, proven=True)
