"""``handlers.grammar`` — text to a typed command: the grammar (:mod:`~handlers.grammar.parse`) and the
typed commands with the normalisation of what Slack and terminals send, their validation and "did
you mean" (:mod:`~handlers.grammar.commands`).

May import: ``pipeline.config``, ``pipeline.errors``, ``pipeline.fmt``, and the words
:mod:`handlers.text`; nothing else of ``handlers``.
"""
