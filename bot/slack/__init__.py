"""``bot.slack`` — the Slack surface: the Bolt app and its acks before follow-ups
(:mod:`~bot.slack.app`; Socket Mode :mod:`~bot.slack.socket_mode`), Block Kit
(:mod:`~bot.slack.blocks`), the Web API, its limits and posts at most once (:mod:`~bot.slack.api`), posts and threads (:mod:`~bot.slack.outbox`), who is who
(:mod:`~bot.slack.people`) and ``check-slack`` (:mod:`~bot.slack.doctor`).

May import: ``bot.text``, ``handlers`` and ``pipeline``; nothing else of ``bot``.
"""
