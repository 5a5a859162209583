"""``handlers`` — transport-free: text → typed command → who is acting → authorisation → a call on
the pipeline → a reply model.

It knows nothing of Slack's wire format: every surface in ``bot`` hands it a
:class:`~handlers.request.dispatch.Request` and shows the :class:`~handlers.reply.Reply` it gets back.
It imports ``pipeline``, never ``bot``.  Its packages, one concept each (each one's docstring says
what it owns and may import):

- :mod:`handlers.request` — a request's way: the dispatcher's steps, roles, confirmations, the verb table;
- :mod:`handlers.grammar` — text to a typed command;
- :mod:`handlers.approval` — the two-person rule;
- :mod:`handlers.runs` — restart/start/stop, the run's message and verdict, follow-ups, attempts;
- :mod:`handlers.watch` — the watch cycle, alerts, acks, storms, crash and hang evidence;
- :mod:`handlers.views` — the read-only verbs and reports.

Loose at the top, read by all of them: the reply model :mod:`~handlers.reply`, where replies go
:mod:`~handlers.outbox`, what a handler is given :mod:`~handlers.context`, and the words a person
reads :mod:`~handlers.text` — one
catalogue for the layer (as Bolt's ``logger/messages.py``): constants for fixed words, small functions
where words take values; it imports no module of ``handlers``, and each module builds its replies from it.
"""
