"""``pipeline.state`` — run state with one owner: the only code that touches Redis.

- every key name :mod:`~pipeline.state.keys` (imported by this package only); the connection
  (embedded or configured) :mod:`~pipeline.state.redisconn`, whose handle opens every store;
- run records and their transitions :mod:`~pipeline.state.runs`; the verification queue
  :mod:`~pipeline.state.verifications`; restart locks :mod:`~pipeline.state.locks`; one job's
  state in one read, and its ``current`` record :mod:`~pipeline.state.jobstate`; incidents and
  the watcher's memory :mod:`~pipeline.state.incidents`; digests' memory
  :mod:`~pipeline.state.digests`; the event stream :mod:`~pipeline.state.events`; the scheduler's
  leader lease :mod:`~pipeline.state.leader`; requests: the audit trail
  :mod:`~pipeline.state.audit`, Slack deliveries acted on once :mod:`~pipeline.state.deliveries`,
  confirmations :mod:`~pipeline.state.confirmations`, approval requests under the two-person rule
  :mod:`~pipeline.state.approvals`; where Slack posts live
  :mod:`~pipeline.state.posts`, and the last alert Slack refused :mod:`~pipeline.state.undelivered`.

A state changes only through its store's named transitions; an illegal one raises
:class:`~pipeline.errors.IllegalTransition`, and Redis's own errors reach callers as
:class:`~pipeline.errors.StateUnavailable` where they cross out of a store.

May import the loose modules of :mod:`pipeline` (config, errors, fmt, verdict) and nothing else
of Pitstop's.
"""
