"""``bot.demo`` — ``pitstop demo``: the whole product on this machine (:mod:`~bot.demo.run`) and its
script language (:mod:`~bot.demo.script`).

May import: ``bot.console``, ``bot.runtime``, ``bot.text``, ``devhost``, ``handlers``, ``pipeline``.
"""
