"""``bot.runtime`` — a running Pitstop: the assembly of its parts from the config
(:mod:`~bot.runtime.assembly`), the environment (:mod:`~bot.runtime.settings`), the scheduler and
its heartbeat (:mod:`~bot.runtime.scheduler`), ``serve`` with ``/healthz`` and ``/metrics``
(:mod:`~bot.runtime.serve`, :mod:`~bot.runtime.metrics`).

May import: ``bot.slack``, ``bot.text``, ``handlers`` and ``pipeline``.
"""
