"""Words for a terminal: the CLI and the console show people and channels as ``@name`` and ``#name``,
never Slack's markup (``<@U…>``, ``<#C…>``, ``<!here>``, ``<!subteam^S…>``), which Slack itself keeps.
The names come from Slack when a bot token is set (:class:`~bot.slack.people.People`, cached), else
the ids are shown (``@U0MAYA``, ``#C0ANNOUNCE1``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.slack.blocks import plain, terminal
from handlers.reply import Reply

if TYPE_CHECKING:
    from bot.runtime.settings import Settings
    from bot.slack.people import People

LOOKUP_TIMEOUT = 5.0  #: seconds a terminal waits for one name from Slack before showing the id


class TerminalNames:
    """Turns replies into terminal words (:func:`~bot.slack.blocks.terminal`), with the names of the
    people and channels they refer to when Slack can tell them.

    :param people: Slack's directory, or None to show ids.
    """

    def __init__(self, people: People | None = None) -> None:
        self.people = people
        self.names: dict[str, str] = {}  #: id (``U…``, ``C…``) → name, as last learnt

    @classmethod
    def from_settings(cls, env: Settings) -> TerminalNames:
        """Names from Slack when ``SLACK_BOT_TOKEN`` is set (``SLACK_API_URL`` honoured), else ids."""
        if not env.bot_token:
            return cls()
        from bot.slack.api import web_client  # lazy: slack_sdk only when a token exists
        from bot.slack.people import People

        client = web_client(env.bot_token, base_url=env.api_url)
        client.timeout = int(LOOKUP_TIMEOUT)
        return cls(People(client, group_roles=False))

    async def reply(self, reply: Reply) -> Reply:
        """``reply`` in terminal words, the names it refers to looked up first (never raises: an
        unknown name shows the id)."""
        if self.people is not None:
            self.names = await self.people.names_for(reply, channels=True)
        return terminal(reply, self.names)

    def text(self, text: str) -> str:
        """One line (a step's) in terminal words, with the names learnt so far."""
        return plain(text, self.names)
