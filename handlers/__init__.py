"""``handlers`` — transport-free: text → typed command → authorisation → action → a reply model.

It knows nothing of Slack's wire format: every surface in ``bot`` hands it a
:class:`~handlers.dispatch.Request` and shows the :class:`~handlers.reply.Reply` it gets back.
It imports ``pipeline``, never ``bot``.

- the request path: :mod:`~handlers.dispatch` (its steps; a request on its way
  :mod:`~handlers.flow`), the two-person rule :mod:`~handlers.twoperson` and
  :mod:`~handlers.approval`, the verb table :mod:`~handlers.verbs`, the grammar
  :mod:`~handlers.grammar` and :mod:`~handlers.normalise`, typed commands :mod:`~handlers.commands`,
  roles :mod:`~handlers.auth`, confirmations :mod:`~handlers.confirm`, the restart lock
  :mod:`~handlers.lock` (their state lives in :mod:`pipeline.state`);
- what is done and shown: :mod:`~handlers.sequences` (restart/start/stop), :mod:`~handlers.runview`,
  :mod:`~handlers.verdicts`, :mod:`~handlers.views` (read-only verbs), :mod:`~handlers.reports`,
  the watch cycle :mod:`~handlers.watching` with :mod:`~handlers.acks`, :mod:`~handlers.alerts`,
  :mod:`~handlers.storm`, :mod:`~handlers.watchstats`, :mod:`~handlers.crashcheck`,
  :mod:`~handlers.hangevidence`, :mod:`~handlers.attempts`, :mod:`~handlers.recovery`;
- the reply model :mod:`~handlers.reply`, :mod:`~handlers.outbox`, :mod:`~handlers.latest`, and
  what a handler is given :mod:`~handlers.context`.

Words computed from values sit in a ``# --- text`` section at the end of the module that answers;
the constant ones are in :mod:`~handlers.text`.
"""
