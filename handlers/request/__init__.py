"""``handlers.request`` — one request's way through Pitstop: the dispatcher's list of steps
(:mod:`~handlers.request.dispatch`, a request on its way :mod:`~handlers.request.flow`), who is acting
and what they may do (:mod:`~handlers.request.auth`), confirmations (a step of the dispatcher, stored
by :mod:`pipeline.state.approvals`) and the verb table (:mod:`~handlers.request.verbs`).

May import: every other package of ``handlers`` (the verb table names their verbs) and ``pipeline``.
"""
