"""Development hosts: peers that run inside this process for ``pitstop demo``, the tests and the
benchmarks — never part of a production deployment.

- :mod:`devhost.sshhost` — an SSH host on 127.0.0.1 (asyncssh's server running real
  ``bash -c`` commands), reached through the same :class:`~pipeline.host.remote.SSHPool` code path
  as a GPU host.

This package sits beside the three layers and imports ``pipeline`` only (never ``handlers`` or
``bot``); ``bot/demo/run.py``, ``tests/`` and ``bench/`` import it.
"""
