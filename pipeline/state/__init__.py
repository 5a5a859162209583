"""``pipeline.state`` — run state with one owner: the only code that touches Redis.

- every key name :mod:`~pipeline.state.keys`; the connection (embedded or configured)
  :mod:`~pipeline.state.redisconn`;
- run records :mod:`~pipeline.state.runs`; one job's state in one read
  :mod:`~pipeline.state.jobstate`; incidents, opened and resolved once each
  :mod:`~pipeline.state.incidents`; the event stream :mod:`~pipeline.state.events`; the
  scheduler's leader lease :mod:`~pipeline.state.leader`.

May import the loose modules of :mod:`pipeline` (config, errors, fmt, verdict) and nothing else
of Pitstop's.
"""
