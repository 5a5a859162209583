"""``bot``: the surfaces and the assembly, the top layer, imported by nothing of Pitstop's.

Slack (:mod:`~bot.slack_app`, served by :mod:`~bot.serve`), the console chat (:mod:`~bot.console`,
:mod:`~bot.say`), the assembly and scheduler (:mod:`~bot.assembly`, :mod:`~bot.scheduler`), the
CLI (:mod:`~bot.cli`) and the demo (:mod:`~bot.demo`); surface text lives beside its surface.
"""
