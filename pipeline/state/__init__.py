"""``pipeline.state`` — run state with one owner: the only code that touches Redis.

Key names live in :mod:`~pipeline.state.keys` (imported by this package only), the connection and
its outages in :mod:`~pipeline.state.redisconn`, whose handle opens every store; each other module
is one store (runs and the verification queue, locks, jobstate and the digests' memory, incidents,
events, leader and the watch clock, audit, Slack deliveries (exactly-once, headline posts, refused
alerts), approvals and confirmations, the notes Pitstop keeps against Slurm nodes).

A state changes only through its store's named transitions; an illegal one raises
:class:`~pipeline.errors.IllegalTransition`, and Redis's own errors reach callers as
:class:`~pipeline.errors.StateUnavailable` where they cross out of a store.

May import :mod:`pipeline.config`, :mod:`pipeline.errors`, :mod:`pipeline.fmt` and
:mod:`pipeline.verdict` only.
"""
