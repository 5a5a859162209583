"""``bot.console`` — Pitstop from a terminal: the console chat (:mod:`~bot.console.chat`) and
``pitstop say`` / ``parse`` (:mod:`~bot.console.say`).

May import: ``bot.runtime``, ``bot.slack.blocks`` (text rendering), ``bot.text``, ``handlers``,
``pipeline``.
"""
