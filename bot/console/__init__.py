"""``bot.console`` — Pitstop from a terminal: the console chat (:mod:`~bot.console.chat`),
``pitstop say`` / ``parse`` (:mod:`~bot.console.say`), words for a terminal (:mod:`~bot.console.words`)
and ``pitstop init`` (:mod:`~bot.console.init`).

May import: ``bot.runtime``, ``bot.slack.blocks`` (text rendering), ``bot.slack.people`` and
``bot.slack.api`` (people's and channels' names), ``bot.text``, ``handlers``, ``pipeline``.
"""
