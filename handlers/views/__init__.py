"""``handlers.views`` — what people read: the read-only verbs (status, logs, patches, checkpoints, lock, history
with ``--attempts``, help, ``follow r-N`` and ``unlock``: :mod:`~handlers.views.read`), reports (digests, GPUs: :mod:`~handlers.views.reports`)
and Slurm nodes (``nodes``, ``drain``, ``undrain``: :mod:`~handlers.views.nodes`).

May import: ``handlers.grammar``, ``handlers.runs``, ``handlers.watch``, the loose modules of ``handlers``,
and ``pipeline``.
"""
