"""``bot``: the surfaces and the assembly, the top layer, imported by nothing of Pitstop's.

- :mod:`bot.slack` — the Slack surface (Bolt over HTTP and Socket Mode, Block Kit, the Web API);
- :mod:`bot.console` — the console chat and ``pitstop say``;
- :mod:`bot.runtime` — a running Pitstop: assembly, settings, scheduler, ``serve``, metrics, heartbeat;
- :mod:`bot.demo` — ``pitstop demo``.

Loose at the top: the CLI (:mod:`~bot.cli`) and the catalogue of every word a person reads from a
surface (:mod:`~bot.text`: constants, and small functions where words take values; a leaf that
imports nothing of ``bot``).
"""
