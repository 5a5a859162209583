"""``pipeline.runs`` — the run service, the one owner of a run's life (:mod:`~pipeline.runs.service`):
its lock, record and steps, cancellation, the verification claim and verdict
(:mod:`~pipeline.runs.verify`), the throughput follow-up and the no-progress rule
(:mod:`~pipeline.runs.attempts`) and the runs whose owner died
(:mod:`~pipeline.runs.orphans`), telling its listeners what happens (:mod:`~pipeline.runs.base`).

May import: ``pipeline.state``, ``pipeline.engines``, ``pipeline.observe``, ``pipeline.host``
(types), ``pipeline.config`` and the loose modules of ``pipeline``; never ``handlers`` or ``bot``.
"""
