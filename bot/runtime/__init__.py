"""``bot.runtime`` — a running Pitstop: the assembly of its parts from the config
(:mod:`~bot.runtime.assembly`), the environment (:mod:`~bot.runtime.settings`), the scheduler
(:mod:`~bot.runtime.scheduler`), ``serve`` with ``/healthz`` and ``/metrics`` (:mod:`~bot.runtime.serve`,
:mod:`~bot.runtime.metrics`) and the heartbeat (:mod:`~bot.runtime.heartbeat`).

May import: ``bot.slack``, ``bot.text``, ``handlers`` and ``pipeline``.
"""
