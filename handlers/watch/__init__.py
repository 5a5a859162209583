"""``handlers.watch`` — the watch cycle and its alerts: the cycle and its own figures
(:mod:`~handlers.watch.cycle`), alert replies and storms told as one story
(:mod:`~handlers.watch.alerts`), acks (:mod:`~handlers.watch.acks`), and the evidence an alert
carries, crashes and hangs (:mod:`~handlers.watch.evidence`).

May import: ``handlers.request`` (the system user; the dispatcher the cycle's automatic restarts go
through), ``handlers.runs`` (a requeue's run headline), the loose modules of ``handlers``, and
``pipeline``.
"""
