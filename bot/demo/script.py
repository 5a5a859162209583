"""The demo's script language: a line is a command as a person would type it, or a directive::

wait verdict|alert|resolved|digest JOB [within N]   that event (at most N s, default 120)
wait ranks JOB [within N]                           every rank wrote a metric line since launch
kill JOB                                            SIGKILL the job's whole session from outside
# comment                                           ignored, as are blank lines
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.text import demo_bad_line
from pipeline.errors import UsageError
from pipeline.state.events import EventKind

DEFAULT_WAIT = 120.0
MAX_WAIT = 1800.0
_WAIT = re.compile(r"^wait\s+(?P<kind>\S+)\s+(?P<job>\S+)(?:\s+within\s+(?P<secs>\S+))?\s*$", re.IGNORECASE)
_KILL = re.compile(r"^kill\s+(?P<job>\S+)\s*$", re.IGNORECASE)
WAITABLE = (EventKind.VERDICT, EventKind.ALERT, EventKind.RESOLVED, EventKind.DIGEST)
RANKS = "ranks"  #: ``wait ranks JOB``: not an event, a condition on the job's metric log


@dataclass(frozen=True)
class Say:
    """A command line, sent to Pitstop as typed."""

    text: str
    lineno: int


@dataclass(frozen=True)
class Wait:
    """``wait KIND JOB [within N]``: the event to await and the bound in seconds."""

    kind: EventKind
    job: str
    within: float
    lineno: int


@dataclass(frozen=True)
class WaitRanks:
    """``wait ranks JOB [within N]``: every rank of the job wrote a metric line since its launch."""

    job: str
    within: float
    lineno: int


@dataclass(frozen=True)
class Kill:
    """``kill JOB``: SIGKILL to the job's session."""

    job: str
    lineno: int


Step = Say | Wait | WaitRanks | Kill


def parse_line(line: str, lineno: int) -> Step | None:
    """One script line → a step, or None for a blank line or comment; :raises UsageError: for a
    malformed ``wait``/``kill`` directive, naming the line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    head = text.split(None, 1)[0].lower()
    if head == "wait":
        m = _WAIT.match(text)
        kinds = {k.value: k for k in WAITABLE}
        if not m or m.group("kind").lower() not in (*kinds, RANKS):
            raise UsageError(
                demo_bad_line(lineno, text, "wait verdict|alert|resolved|digest|ranks JOB [within N]")
            )
        within = DEFAULT_WAIT
        if m.group("secs") is not None:
            try:
                within = float(m.group("secs").rstrip("s"))
            except ValueError:
                within = -1
            if not 0 < within <= MAX_WAIT:
                raise UsageError(demo_bad_line(lineno, text, f"within N, 0 < N <= {MAX_WAIT:g} seconds"))
        if m.group("kind").lower() == RANKS:
            return WaitRanks(m.group("job"), within, lineno)
        return Wait(kinds[m.group("kind").lower()], m.group("job"), within, lineno)
    if head == "kill":
        m = _KILL.match(text)
        if not m:
            raise UsageError(demo_bad_line(lineno, text, "kill JOB"))
        return Kill(m.group("job"), lineno)
    return Say(text, lineno)


def parse_script(text: str) -> list[Step]:
    """A whole script → its steps; :raises UsageError: at the first malformed directive."""
    return [step for n, line in enumerate(text.splitlines(), 1) if (step := parse_line(line, n)) is not None]
