"""``handlers`` — transport-free: text → typed command → authorisation → action → a reply model.

It knows nothing of Slack's wire format (no ``slack_bolt``/``slack_sdk``, no Block Kit): every
surface in ``bot`` hands it a :class:`~handlers.dispatch.Request` and shows the
:class:`~handlers.reply.Reply` it gets back.  It imports ``pipeline``, never ``bot``.  Where each
concept lives:

- the request path: :mod:`~handlers.dispatch` (parse → dedupe → authorise → confirm → approval →
  act, one list of steps for typed commands and buttons; a request on its way :mod:`~handlers.flow`);
  the two-person rule's step :mod:`~handlers.twoperson` and its rules and words
  :mod:`~handlers.approval`; the verb table :mod:`~handlers.verbs`; the
  grammar :mod:`~handlers.grammar` and :mod:`~handlers.normalise`; typed commands and parse errors
  :mod:`~handlers.commands`; roles :mod:`~handlers.auth`; confirmations :mod:`~handlers.confirm`
  and the restart lock :mod:`~handlers.lock` as people read them (their state, the audit trail
  and deliveries acted on once live in :mod:`pipeline.state`);
- what is done and shown: restart/start/stop :mod:`~handlers.sequences`; a run as people see it
  :mod:`~handlers.runview`; verdict delivery :mod:`~handlers.verdicts`; the read-only verbs
  :mod:`~handlers.views`; digests and GPUs
  :mod:`~handlers.reports`; the watch cycle :mod:`~handlers.watching` (``ack`` and ``watch`` :mod:`~handlers.acks`), its
  alerts :mod:`~handlers.alerts`, alert storms told as one story :mod:`~handlers.storm`, its
  measurements :mod:`~handlers.watchstats`, crash checks :mod:`~handlers.crashcheck` and hang
  evidence :mod:`~handlers.hangevidence`; no-progress loops and ``history --attempts``
  :mod:`~handlers.attempts`; the throughput follow-up after a restart :mod:`~handlers.recovery`;
- the reply model :mod:`~handlers.reply`, where team-visible posts go :mod:`~handlers.outbox`,
  a live message delivered at the surface's pace, last state wins :mod:`~handlers.latest`, and
  what a handler is given :mod:`~handlers.context`.

Each reply's words that compute sit beside the verb that answers it (a ``# --- text`` section at
the end of its module); the constant ones are in the layer's catalogue :mod:`~handlers.text`.
"""
