"""The constant words of the surfaces in ``bot/`` (words computed from values are functions
beside their surface)."""

from __future__ import annotations

SLACK_UNTITLED = "(no text)"  #: what an empty reply shows (Slack refuses empty text)
SLACK_HOME_TITLE = "Pitstop - jobs"  #: the heading of Pitstop's App Home tab
CONSOLE_PROMPT = "pitstop> "  #: the console chat's input prompt
CONSOLE_CONFIRM = "confirm? [y/N] "  #: the console's question for a reply that asks for confirmation
CONSOLE_BYE = "bye"  #: the console's last line
