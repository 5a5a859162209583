"""``pitstop check-slack``: what Slack will refuse, found before a post is: the token, its scopes,
each channel, the slash command against ``slack-manifest.yml`` and with ``--post`` a test message;
one ``ok``/``warn``/``FAIL`` line each, exit 1 if any failed.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TextIO

import aiohttp
import yaml
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.api import ERRORS, error_text, web_client
from bot.slack.app import needs_groups
from pipeline.config import Config
from pipeline.errors import ExitCode

#: scopes every installation needs: commands and mentions in, posts/threads/uploads out, names,
#: DMs to a requester whose post was refused, and the look-up before a retry
BASE_SCOPES = (
    "commands",
    "app_mentions:read",
    "im:history",
    "chat:write",
    "files:write",
    "im:write",
    "users:read",
    "channels:read",
    "channels:history",
)
MANIFEST = Path(__file__).resolve().parents[2] / "slack-manifest.yml"


def channels_of(config: Config) -> dict[str, list[str]]:
    """Channel id → what posts there (``announce``, job names and/or ``fallback``)."""
    out: dict[str, list[str]] = {}
    slack = config.slack
    pairs = [(slack.announce_channel, "announce"), *((config.channel_for(j), j) for j in config.jobs)]
    for channel, user in [*pairs, (slack.fallback_channel, "fallback")]:
        if channel:
            out.setdefault(channel, []).append(user)
    return out


def manifest_command(path: Path = MANIFEST) -> str | None:
    """The slash command ``slack-manifest.yml`` declares, or None if the file is not there."""
    if not path.is_file():
        return None
    commands = yaml.safe_load(path.read_text()).get("features", {}).get("slash_commands") or []
    return next((str(c["command"]) for c in commands), None)


class Doctor:
    """Runs the checks and prints them to ``out``."""

    def __init__(self, config: Config, client: AsyncWebClient, out: TextIO) -> None:
        self.config = config
        self.client = client
        self.out = out
        self.marks: Counter[str] = Counter()  #: checks by result (``ok``, ``warn``, ``FAIL``)

    def line(self, mark: str, text: str) -> None:
        """Print one check's result; ``mark`` is ``ok``, ``warn`` or ``FAIL``."""
        self.marks[mark] += 1
        print(f"{mark:<4} {text}", file=self.out, flush=True)

    async def run(self, *, post: bool) -> int:
        """All the checks (``post``: also a test message to each channel); return the exit code."""
        try:
            auth = await self.client.auth_test()
        except ERRORS as exc:
            self.line("FAIL", f"token: auth.test refused it ({error_text(exc)}) - check SLACK_BOT_TOKEN")
            return int(ExitCode.FAILED)
        self.line("ok", f"token: bot {auth.get('user')} ({auth.get('user_id')}) in {auth.get('team')}")
        granted = {s.strip() for s in str(auth.headers.get("x-oauth-scopes", "")).split(",") if s.strip()}
        # and ``usergroups:read`` when the config names a user group
        needed = [*BASE_SCOPES, *(["usergroups:read"] if needs_groups(self.config) else [])]
        missing = [s for s in needed if s not in granted]
        if missing:
            self.line(
                "FAIL",
                f"scopes: missing {', '.join(missing)} - add them from slack-manifest.yml and reinstall the app",
            )
        else:
            self.line("ok", f"scopes: {len(granted)} granted, all {len(needed)} needed present")
        public = "chat:write.public" in granted
        joins = "channels:join" in granted
        channels = channels_of(self.config)
        if not channels:
            self.line("FAIL", "channels: none configured - set [slack] announce_channel")
        for channel, users in channels.items():
            await self.check_channel(channel, ", ".join(users), public=public, joins=joins)
        self.check_command()
        if post:
            for channel in channels:
                await self.try_post(channel)
        failed = self.marks["FAIL"]
        self.line("FAIL" if failed else "ok", f"{failed} failed, {self.marks['warn']} warning(s)")
        return int(ExitCode.FAILED) if failed else 0

    async def check_channel(self, channel: str, used_by: str, *, public: bool, joins: bool) -> None:
        """``conversations.info``: the channel exists, is not archived, read-only, threads-only or
        restricted to some posters (``properties.posting_restricted_to``), and the bot can post
        there, found without posting."""
        try:
            info = (await self.client.conversations_info(channel=channel))["channel"]
        except ERRORS as exc:
            error = error_text(exc)
            hint = (
                "check the id, or /invite @pitstop if it is private" if error == "channel_not_found" else ""
            )
            self.line("FAIL", f"channel {channel} ({used_by}): {error} {hint}".rstrip())
            return
        name = f"#{info.get('name', channel)} ({channel}, {used_by})"
        restricted = (info.get("properties") or {}).get("posting_restricted_to")
        if info.get("is_archived"):
            self.line("FAIL", f"channel {name}: archived - unarchive it or configure another channel")
        elif info.get("is_read_only") or info.get("is_thread_only") or restricted:
            how = "read-only" if info.get("is_read_only") else "admins only" if restricted else "threads only"
            self.line(
                "FAIL",
                f"channel {name}: posting is restricted ({how}), Slack answers restricted_action - "
                "allow the app to post in the channel's settings or configure another channel",
            )
        elif info.get("is_member"):
            self.line("ok", f"channel {name}: the bot is a member")
        elif not info.get("is_private") and public:
            how = "Pitstop joins it before uploading a chart" if joins else "charts need /invite @pitstop"
            self.line("warn", f"channel {name}: not a member; posts work (chat:write.public), {how}")
        else:
            self.line("FAIL", f"channel {name}: the bot is not a member - /invite @pitstop there")

    def check_command(self) -> None:
        """``[slack] command`` against the manifest's slash command."""
        declared = manifest_command()
        command = self.config.slack.command
        if declared is None:
            self.line(
                "warn", f"command: {command} cannot be checked over the API - make sure the app declares it"
            )
        elif declared == command:
            self.line("ok", f"command: {command} (as in slack-manifest.yml)")
        else:
            self.line(
                "FAIL", f"command: [slack] command is {command} but slack-manifest.yml declares {declared}"
            )

    async def try_post(self, channel: str) -> None:
        """Post a test message to ``channel`` and delete it."""
        try:
            resp = await self.client.chat_postMessage(
                channel=channel, text="pitstop check-slack: test message"
            )
        except ERRORS as exc:
            self.line("FAIL", f"post to {channel}: {error_text(exc)}")
            return
        try:
            await self.client.chat_delete(channel=channel, ts=str(resp["ts"]))
        except ERRORS as exc:
            self.line("warn", f"post to {channel}: posted, but deleting it failed ({error_text(exc)})")
            return
        self.line("ok", f"post to {channel}: posted and deleted")


async def check_slack(
    config: Config, *, bot_token: str, api_url: str | None, post: bool = False, out: TextIO | None = None
) -> int:
    """Run ``pitstop check-slack`` (lines to ``out``, default stdout); return the exit code."""
    async with aiohttp.ClientSession() as session:
        client = web_client(bot_token, base_url=api_url, session=session)
        return await Doctor(config, client, out or sys.stdout).run(post=post)
