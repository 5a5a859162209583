"""``handlers.approval`` — the two-person rule: which actions wait, who may decide them and its
step in the dispatcher (:mod:`~handlers.approval.twoperson`).
Requests are stored by :mod:`pipeline.state.approvals`.

May import: ``handlers.request.auth`` and ``handlers.request.flow`` (roles, the step protocol),
``handlers.grammar``, ``handlers.runs``, the loose modules of ``handlers``, and ``pipeline``.
"""
