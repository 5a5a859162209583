"""``handlers.runs`` — runs as people see them: what the run service (:mod:`pipeline.runs`) tells,
posted (:mod:`~handlers.runs.posts`: the live message, summaries, verdicts, take-overs, follow-ups),
and the run's live message and verdict as replies (:mod:`~handlers.runs.view`).

May import: ``handlers.grammar``, the loose modules of ``handlers``, and ``pipeline``.
"""
