"""argv → the one command line SSH carries, correct at every layer.

The remote ``sshd`` hands the command string to the login shell (``$SHELL -c STRING``), so
Pitstop builds the final argv (the job's ``exec`` prefix, such as ``pct exec 200 --`` or
``docker exec -i NAME``, then the program) and quotes it once with :func:`shlex.join`: the
program gets exactly that argv, nothing expanded.  Such wrappers ``execvp`` their argv; one that
runs its argument through a shell (``su -c``) needs it quoted once more.  Assumes a POSIX login
shell (``csh``/``fish`` parse single quotes differently).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def job_argv(exec_prefix: Sequence[str], argv: Sequence[str]) -> list[str]:
    """The argv run on the host for a job-side command: a new list, ``exec_prefix + argv``.

    :raises ValueError: if ``argv`` is empty.
    """
    if not argv:
        raise ValueError("empty argv")
    return [*exec_prefix, *argv]


def command_line(argv: Sequence[str]) -> str:
    """The string to send over SSH so the remote POSIX shell runs exactly ``argv``.

    :raises ValueError: if ``argv`` is empty or an element contains a NUL byte (no
        program can receive one).
    """
    if not argv:
        raise ValueError("empty argv")
    if any("\0" in a for a in argv):
        raise ValueError("argv elements cannot contain NUL bytes")
    return shlex.join(argv)
