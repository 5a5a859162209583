"""``handlers.runs`` — runs as people see them: restart/start/stop and ``cancel``
(:mod:`~handlers.runs.sequences`), the run's live message and verdict (:mod:`~handlers.runs.view`), the
verdict's delivery (:mod:`~handlers.runs.verdicts`), the throughput follow-up
(:mod:`~handlers.runs.followup`), the restart lock's refusal (:mod:`~handlers.runs.lock`) and attempts
with the no-progress rule (:mod:`~handlers.runs.attempts`).

May import: ``handlers.grammar``, ``handlers.watch.crashcheck``, the loose modules of ``handlers``, and ``pipeline``.
"""
