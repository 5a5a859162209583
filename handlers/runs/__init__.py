"""``handlers.runs`` — runs as people see them (:mod:`~handlers.runs.view`): the run's live message
and verdict as replies, and what the run service (:mod:`pipeline.runs`) tells, posted (the live
message, summaries, verdicts, take-overs, follow-ups).

May import: ``handlers.grammar``, the loose modules of ``handlers``, and ``pipeline``.
"""
