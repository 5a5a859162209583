"""argv → the one command line SSH carries, correct at every layer.

SSH carries a single string; the remote ``sshd`` hands it to the user's login shell as
``$SHELL -c STRING``, which splits it again.  So Pitstop builds the *final* argv first —
the job's ``exec`` prefix (``pct exec 200 --``, ``docker exec -i NAME``) followed by the
program and its arguments — and quotes it once with :func:`shlex.join`.  The remote shell
then reproduces exactly that argv: spaces, quotes, ``$``, ``;``, ``&``, ``*`` and newlines
reach the program as they are, and nothing is expanded on either machine.

Wrappers such as ``pct exec ID --`` (lxc-attach) and ``docker exec NAME`` pass their argv
unchanged to ``execvp`` (no second shell), so one layer of quoting is right.  A wrapper that
*does* run its argument through a shell (``su -c STRING``, ``lxc-attach`` without ``--``)
needs that argument quoted once more (``command_line`` applied twice).

Assumes the remote login shell is POSIX (bash, dash, zsh, ash); ``csh``/``fish`` parse
single quotes differently.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def job_argv(exec_prefix: Sequence[str], argv: Sequence[str]) -> list[str]:
    """The argv run on the host for a job-side command: ``exec_prefix + argv``.

    :param exec_prefix: the job's ``exec`` list (may be empty).
    :param argv: the program and its arguments, as the program must receive them.
    :returns: a new list.
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
