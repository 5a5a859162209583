"""The one module that reads the environment; secrets (Slack tokens) come only from here and
are never logged or echoed."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass, field

PUBLIC_HOST, PUBLIC_PORT = "0.0.0.0", 3000  #: ``serve``'s public listener (/slack/events), by default
ADMIN_HOST, ADMIN_PORT = "127.0.0.1", 9300  #: ``serve``'s admin listener (/healthz/details, /metrics)
#: :class:`Settings` field → the environment variable it is read from
ENVIRON = dict(
    bot_token="SLACK_BOT_TOKEN",
    signing_secret="SLACK_SIGNING_SECRET",
    app_token="SLACK_APP_TOKEN",
    api_url="SLACK_API_URL",  # its trailing "/" is web_client's to add
    config_path="PITSTOP_CONFIG",
    user="PITSTOP_USER",
    heartbeat_url="PITSTOP_HEARTBEAT_URL",
    pagerduty_routing_key="PAGERDUTY_ROUTING_KEY",
    pagerduty_api_token="PAGERDUTY_API_TOKEN",
)


@dataclass(frozen=True)
class Settings:
    """Values taken from the environment at start-up (None when unset)."""

    bot_token: str | None = field(default=None, repr=False)  #: ``SLACK_BOT_TOKEN`` (``xoxb-…``)
    signing_secret: str | None = field(default=None, repr=False)  #: ``SLACK_SIGNING_SECRET`` (HTTP mode)
    app_token: str | None = field(default=None, repr=False)  #: ``SLACK_APP_TOKEN`` (``xapp-…``, Socket Mode)
    api_url: str | None = None  #: ``SLACK_API_URL``: the Web API base URL (proxies, tests), for web_client
    config_path: str | None = None  #: ``PITSTOP_CONFIG``
    user: str | None = None  #: ``PITSTOP_USER``: who the console and ``pitstop say`` act as (as ``--as``)
    #: the OS user running Pitstop, from the process's real uid (not ``$USER``, which anyone can set)
    os_user: str = ""
    #: ``PITSTOP_HEARTBEAT_URL``: ``[health] heartbeat_url``'s value kept out of the file (wins over it)
    heartbeat_url: str | None = field(default=None, repr=False)
    #: ``PAGERDUTY_ROUTING_KEY``: the Events API v2 integration key (``[pager] kind = "pagerduty"``)
    pagerduty_routing_key: str | None = field(default=None, repr=False)
    #: ``PAGERDUTY_API_TOKEN``: a REST API key that reads incidents (``[pager] sync_acks``)
    pagerduty_api_token: str | None = field(default=None, repr=False)


def os_user() -> str:
    """The name of the OS user running this process (its real uid's ``passwd`` entry; the uid as
    digits when it has none)."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def from_environ(environ: dict[str, str] | None = None) -> Settings:
    """Read :class:`Settings` from ``environ`` (default: ``os.environ``), empty values counting as
    unset, and the OS user from the process's uid."""
    env = os.environ if environ is None else environ
    values = {field: env.get(name, "").strip() or None for field, name in ENVIRON.items()}
    return Settings(**values, os_user=os_user())
