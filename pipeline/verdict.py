"""The restart's steps (:class:`Step`, each ending with an :class:`Outcome`), its verdict (:class:`Verdict`)
and the verdict line: one owner that formats it and parses it.

The verdict line is a contract for people and scripts alike (``pitstop say --wait`` prints it,
the README lists its forms): one line, the verdict's name first, then the facts behind it; each
builder (:func:`running`, …) shows its forms.

:class:`VerdictLine` holds the facts; :func:`format_line` writes the line, :func:`parse_line` reads
it back (``format_line(parse_line(s)) == s``); the engines call the builders (:func:`running`, …).
Imports :mod:`pipeline.fmt` and the standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from pipeline import fmt


class Step(StrEnum):
    """The steps of the restart sequence, in order; the values are the labels people see."""

    PREFLIGHT = "preflight"
    STOP = "stop"
    CLEAR_CACHE = "clear_cache"
    PATCH = "patch"
    LAUNCH = "launch"
    VERIFY = "verify"


class Outcome(StrEnum):
    """How one step ended."""

    RUNNING = "running"  #: started, not finished yet
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  #: nothing to do (no cache asked for, no patch change)
    WAITING = "waiting"  #: verify scheduled, not yet due


class Verdict(StrEnum):
    """The closed set of outcomes of a run, in precedence order (first applicable wins)."""

    PREFLIGHT_FAILED = "PREFLIGHT_FAILED"
    STOP_FAILED = "STOP_FAILED"
    LAUNCH_FAILED = "LAUNCH_FAILED"
    STALE_RECORD = "STALE_RECORD"
    CANCELLED = "CANCELLED"
    INTERRUPTED = "INTERRUPTED"
    EXITED = "EXITED"
    ERROR_IN_LOG = "ERROR_IN_LOG"
    WRONG_COUNT = "WRONG_COUNT"
    NO_PROGRESS = "NO_PROGRESS"
    PENDING = "PENDING"  #: still queued by the scheduler (Slurm) at the deadline; re-checked later
    RUNNING = "RUNNING"

    @property
    def ok(self) -> bool:
        """True only for ``RUNNING``."""
        return self is Verdict.RUNNING


ERROR_LINE_LIMIT = 200  #: characters of the log's error line kept in an ERROR_IN_LOG line
_NOT_RELAUNCHED = " - the job is stopped and was not relaunched"
_NOTHING_CHANGED = " - nothing was changed"
_OWNER_STOPPED = " - Pitstop stopped before the sequence finished"


@dataclass(frozen=True)
class VerdictLine:
    """The facts a verdict line carries; which fields are set depends on the verdict (in brackets)."""

    verdict: Verdict  #: the line's first word
    seen: int | None = None  #: processes found (RUNNING, WRONG_COUNT, NO_PROGRESS, INTERRUPTED after launch)
    expected: int | None = None  #: processes expected
    pid: int | None = None  #: the launched (or recorded) pid, on the SSH engine
    job_id: int | None = None  #: the Slurm job id, on the Slurm engine
    nodes: int | None = None  #: the node count a Slurm job runs on (RUNNING)
    resumed_at: int | None = None  #: the step resumed at (RUNNING), when not 0
    ignored_checkpoint: int | None = None  #: the checkpoint's step a run started from 0 in spite of
    #: the resumed RUNNING line's :class:`Lost` clause: the step the previous run reached, the steps
    #: lost, the role compared (None: one role), their training time (s) and the checkpoint's time
    #: (as :func:`pipeline.fmt.clock` shows it)
    reached: int | None = None
    lost: int | None = None
    lost_role: str | None = None
    lost_s: float | None = None
    checkpoint_at: str | None = None
    code: int | None = None  #: the exit code (EXITED)
    signal: str | None = None  #: the signal that ended it (EXITED), e.g. ``SIGKILL``
    after_s: float | None = None  #: seconds from launch to the exit (EXITED), shown to 0.1 s
    silent_s: float | None = None  #: seconds the log was silent (NO_PROGRESS), shown whole
    queued_s: float | None = None  #: seconds queued (PENDING), shown as :func:`pipeline.fmt.duration`
    reason: str | None = None  #: the scheduler's pending reason (PENDING), e.g. ``Resources``
    check: str | None = None  #: the pre-flight check that failed (PREFLIGHT_FAILED)
    survivors: tuple[int, ...] = ()  #: pids that outlived the stop (STOP_FAILED)
    #: the step a run was cancelled after or interrupted during (None: before stop; ``start``:
    #: interrupted before any step; ``launch`` with ``after_launch``)
    step: str | None = None
    after_launch: bool = False  #: INTERRUPTED after the launch
    state: str | None = None  #: INTERRUPTED after launch: ``alive``, ``gone``, ``unknown`` or ``pending``
    #: free text: the log's error line, a failure's detail, what a probe found, a Slurm job's short nodes
    detail: str = ""
    then: VerdictLine | None = None  #: STALE_RECORD: the verdict the run had apart from the stale record

    def __str__(self) -> str:
        return format_line(self)


# --- writing --------------------------------------------------------------------------------------


def one_line(text: str) -> str:
    """``text`` as one line: every run of whitespace (line breaks included) a single space, none at the ends."""
    return " ".join(text.split())


def _secs(seconds: float) -> float:
    """Seconds as a line shows them: never negative (a host clock stepped back), never NaN."""
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _who(v: VerdictLine) -> str:
    return f"job {v.job_id}" if v.job_id is not None else f"pid {v.pid}"


def _count(v: VerdictLine) -> str:
    return f"{v.seen}/{v.expected} processes {_who(v)}"


def _steps(n: int, role: str | None) -> str:
    word = f"{role} step" if role else "step"
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _lost_clause(v: VerdictLine) -> str:
    """``; the previous run reached drafter step 1,004 — 533 drafter steps (about 4 min of training)
    lost since the checkpoint of 00:32:01 UTC`` (the duration and the checkpoint's time when known)."""
    assert v.reached is not None and v.lost is not None
    role = one_line(v.lost_role or "").replace(" ", "_") or None
    text = (
        f"; the previous run reached {role + ' ' if role else ''}step {v.reached:,} — {_steps(v.lost, role)}"
    )
    if v.lost and v.lost_s is not None and math.isfinite(v.lost_s) and v.lost_s >= 1:  # never "about 0 s"
        text += f" (about {fmt.duration(_secs(v.lost_s))} of training)"
    text += " lost"
    if v.checkpoint_at:
        text += f" since the checkpoint of {one_line(v.checkpoint_at)}"
    return text


def format_line(v: VerdictLine) -> str:
    """The one-line text of a verdict (the forms the builders show).

    Free text (``detail``, ``check``, ``reason``) is written on one line (:func:`one_line`) and
    seconds are never negative, so every line written reads back with :func:`parse_line`.

    :raises ValueError: if ``v`` lacks a field its verdict's line needs.
    """
    V = Verdict
    detail = one_line(v.detail)
    try:
        if v.verdict is V.RUNNING:
            line = f"RUNNING {_count(v)}"
            if v.job_id is not None:  # Slurm: the same clauses follow the nodes
                assert v.nodes is not None
                line += f" on {v.nodes} node{'s' if v.nodes != 1 else ''}"
            if v.ignored_checkpoint is not None:
                return f"{line}, started from step 0 although checkpoint step {v.ignored_checkpoint} exists"
            if not v.resumed_at:  # from scratch: a restart still says what the previous run lost
                return line + (", started from step 0" + _lost_clause(v) if v.lost else "")
            line = f"{line}, resumed at step {v.resumed_at}"
            return line + _lost_clause(v) if v.reached is not None and v.lost is not None else line
        if v.verdict is V.PENDING:
            assert v.queued_s is not None and v.job_id is not None
            reason = one_line(v.reason or "") or "None"
            return f"PENDING reason {reason} (job {v.job_id} queued {fmt.duration(_secs(v.queued_s))})"
        if v.verdict is V.WRONG_COUNT:
            return f"WRONG_COUNT {_count(v)}" + (f" ({detail})" if detail else "")
        if v.verdict is V.NO_PROGRESS:
            assert v.silent_s is not None
            return f"NO_PROGRESS {_count(v)} log silent {_secs(v.silent_s):.0f} s"
        if v.verdict is V.EXITED:
            assert v.after_s is not None
            after = f"after {_secs(v.after_s):.1f} s"
            if v.signal:
                return f"EXITED signal {one_line(v.signal)} {after}"
            if v.code is not None:
                return f"EXITED code {v.code} {after}"
            return f"EXITED {after} (exit code unknown)"
        if v.verdict is V.ERROR_IN_LOG:
            cut = detail[:ERROR_LINE_LIMIT].rstrip()
            return f"ERROR_IN_LOG {_who(v)}:" + (f" {cut}" if cut else "")
        if v.verdict is V.PREFLIGHT_FAILED:
            check = one_line(v.check or "").replace(":", "")
            return f"PREFLIGHT_FAILED {check}:" + (f" {detail}" if detail else "")
        if v.verdict is V.STOP_FAILED:
            pids = ", ".join(str(p) for p in v.survivors)
            head = f"STOP_FAILED survivors pid {pids}" if pids else "STOP_FAILED"
            return f"{head}: {detail}" if detail else head
        if v.verdict is V.LAUNCH_FAILED:
            return "LAUNCH_FAILED" + (f" {detail}" if detail else "")
        if v.verdict is V.STALE_RECORD:
            assert v.then is not None
            return f"STALE_RECORD pid {v.pid} not signalled (start time differs); then: {format_line(v.then)}"
        step = one_line(v.step or "").replace(" ", "_")
        if v.verdict is V.CANCELLED:
            return (
                f"CANCELLED after {step}{_NOT_RELAUNCHED}"
                if step
                else f"CANCELLED before stop{_NOTHING_CHANGED}"
            )
        if v.verdict is V.INTERRUPTED:
            if v.after_launch:
                head = f"INTERRUPTED after launch: {_who(v)}"
                if v.state == "alive":
                    return f"{head} running {v.seen}/{v.expected} (unverified)"
                if v.state in ("unknown", "pending"):
                    return f"{head} {'state unknown' if v.state == 'unknown' else 'pending'} (unverified)"
                return f"{head} gone, {v.seen}/{v.expected} (unverified)"
            during = f"INTERRUPTED during {step or 'start'}"
            return f"{during}: {detail}" if detail else during + _OWNER_STOPPED
    except AssertionError:
        pass
    raise ValueError(f"a {v.verdict} verdict line needs more than {v!r}")


@dataclass(frozen=True)
class Lost:
    """What a restart that resumed from a checkpoint lost: the verdict line's last clause."""

    reached: int  #: the previous run's highest logged step of ``role``
    steps: int  #: ``reached`` minus the step resumed at (never negative)
    role: str | None = None  #: the role whose step is compared (``drafter``); None: the job has one
    seconds: float | None = None  #: training time those steps took at the previous run's rate, if known
    checkpoint_at: str | None = None  #: when the checkpoint was written (:func:`pipeline.fmt.clock`)

    def on(self, line: VerdictLine) -> VerdictLine:
        """``line`` (a resumed RUNNING line's facts) carrying this clause."""
        return replace(
            line,
            reached=self.reached,
            lost=self.steps,
            lost_role=self.role,
            lost_s=self.seconds,
            checkpoint_at=self.checkpoint_at,
        )


# --- the builders the engines call -----------------------------------------------------------------


def running(
    seen: int,
    expected: int,
    pid: int,
    *,
    resumed_at: int | None = None,
    ignored_checkpoint: int | None = None,
    lost: Lost | None = None,
) -> str:
    """``RUNNING 8/8 processes pid 4242`` (``, resumed at step N`` / ``, started from step 0 although …``;
    with ``lost``, what the previous run reached and what the restart lost)."""
    line = VerdictLine(
        Verdict.RUNNING, seen, expected, pid=pid, resumed_at=resumed_at, ignored_checkpoint=ignored_checkpoint
    )
    return format_line(lost.on(line) if lost is not None else line)


def pending(reason: str, job_id: int, queued_s: float) -> str:
    """``PENDING reason Resources (job 4242 queued 2 min)`` (Slurm)."""
    return format_line(VerdictLine(Verdict.PENDING, job_id=job_id, reason=reason or None, queued_s=queued_s))


def wrong_count(
    seen: int, expected: int, *, pid: int | None = None, job_id: int | None = None, short: Sequence[str] = ()
) -> str:
    """``WRONG_COUNT 5/8 processes pid 4242`` or ``WRONG_COUNT 7/8 processes job 4242 (n2: 3/4)``."""
    return format_line(
        VerdictLine(Verdict.WRONG_COUNT, seen, expected, pid=pid, job_id=job_id, detail=", ".join(short))
    )


def no_progress(
    seen: int, expected: int, silent_s: float, *, pid: int | None = None, job_id: int | None = None
) -> str:
    """``NO_PROGRESS 8/8 processes pid 4242 log silent 60 s`` (``silent_s``: seconds)."""
    return format_line(
        VerdictLine(Verdict.NO_PROGRESS, seen, expected, pid=pid, job_id=job_id, silent_s=silent_s)
    )


def exited(code: int | None, signal: str | None, after_s: float) -> str:
    """``EXITED code 3 after 1.2 s`` (or ``signal SIGKILL``, or ``(exit code unknown)``); ``after_s``: seconds."""
    return format_line(VerdictLine(Verdict.EXITED, code=code, signal=signal or None, after_s=after_s))


def error_in_log(line: str, *, pid: int | None = None, job_id: int | None = None) -> str:
    """``ERROR_IN_LOG pid 4242: RuntimeError: CUDA out of memory`` (the line cut to 200 characters)."""
    return format_line(
        VerdictLine(Verdict.ERROR_IN_LOG, pid=pid, job_id=job_id, detail=line[:ERROR_LINE_LIMIT])
    )


def preflight_failed(check: str, detail: str) -> str:
    """``PREFLIGHT_FAILED patch: topk does not apply: …``."""
    return format_line(VerdictLine(Verdict.PREFLIGHT_FAILED, check=check, detail=detail))


def stop_failed(survivors: Sequence[int], detail: str) -> str:
    """``STOP_FAILED survivors pid 4242, 4243: …``."""
    return format_line(VerdictLine(Verdict.STOP_FAILED, survivors=tuple(survivors), detail=detail))


def launch_failed(detail: str) -> str:
    """``LAUNCH_FAILED cannot start ./run.sh: …``."""
    return format_line(VerdictLine(Verdict.LAUNCH_FAILED, detail=detail))


def stale_record(pid: int, then: str) -> str:
    """``STALE_RECORD pid 4242 not signalled (start time differs); then: <the line it had apart from that>``."""
    return format_line(VerdictLine(Verdict.STALE_RECORD, pid=pid, then=parse_line(then)))


def cancelled(after_step: str | None) -> str:
    """``CANCELLED before stop - …`` (nothing changed) or ``CANCELLED after patch - …`` (job stopped)."""
    return format_line(VerdictLine(Verdict.CANCELLED, step=after_step))


def interrupted(step: str | None, found: str | None = None) -> str:
    """``INTERRUPTED during stop: the old run (pid 4242) is still alive, 8/8 processes``: the step the
    owner died in (None: before any step) and what a probe of the host ``found`` (None: no probe, the
    sequence was cancelled by its own process)."""
    return format_line(VerdictLine(Verdict.INTERRUPTED, step=step or "start", detail=found or ""))


def interrupted_after_launch(
    state: str, seen: int, expected: int, *, pid: int | None = None, job_id: int | None = None
) -> str:
    """``INTERRUPTED after launch: pid 5151 running 8/8 (unverified)`` (or ``job 42 pending``): the
    owner died after the launch; ``state``: ``alive``, ``gone``, ``unknown`` or ``pending`` (Slurm)."""
    return format_line(
        VerdictLine(
            Verdict.INTERRUPTED,
            seen,
            expected,
            pid=pid,
            job_id=job_id,
            step="launch",
            after_launch=True,
            state=state,
        )
    )


# --- reading --------------------------------------------------------------------------------------

_N = r"[0-9]+"
_WHO = rf"(?:pid (?P<pid>{_N})|job (?P<job_id>{_N}))"
_COUNT = rf"(?P<seen>{_N})/(?P<expected>{_N}) processes {_WHO}"
_PID_COUNT = (  # a RUNNING line's count and who: a pid, or a Slurm job and its nodes
    rf"(?P<seen>{_N})/(?P<expected>{_N}) processes (?:pid (?P<pid>{_N})|job (?P<job_id>{_N}) on (?P<nodes>{_N}) nodes?)"
)
_SECS = r"[0-9]+(?:\.[0-9])?"
_GROUPED = r"[0-9]{1,3}(?:,[0-9]{3})*"
_LOST = (
    rf"(?:; the previous run reached (?:(?P<lost_role>[A-Za-z0-9_.-]+) )?step (?P<reached>{_GROUPED})"
    rf" — (?P<lost>{_GROUPED}) (?:[A-Za-z0-9_.-]+ )?steps?(?: \(about (?P<lost_s>[^)]+) of training\))? lost"
    r"(?: since the checkpoint of (?P<checkpoint_at>.+))?)?"
)


def _forms(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(f"^{p}$", re.ASCII) for p in patterns)


_FORMS: dict[Verdict, tuple[re.Pattern[str], ...]] = {
    Verdict.RUNNING: _forms(
        rf"RUNNING {_PID_COUNT}, started from step 0 although checkpoint step (?P<ignored_checkpoint>{_N}) exists",
        rf"RUNNING {_PID_COUNT}, started from step 0{_LOST}",
        rf"RUNNING {_PID_COUNT}(?:, resumed at step (?P<resumed_at>{_N}){_LOST})?",
    ),
    Verdict.PENDING: _forms(
        rf"PENDING reason (?P<reason>.+) \(job (?P<job_id>{_N}) queued (?P<queued_s>[^)]+)\)"
    ),
    Verdict.WRONG_COUNT: _forms(rf"WRONG_COUNT {_COUNT}(?: \((?P<detail>.+)\))?"),
    Verdict.NO_PROGRESS: _forms(rf"NO_PROGRESS {_COUNT} log silent (?P<silent_s>{_N}) s"),
    Verdict.EXITED: _forms(
        rf"EXITED signal (?P<signal>\S+) after (?P<after_s>{_SECS}) s",
        rf"EXITED code (?P<code>-?{_N}) after (?P<after_s>{_SECS}) s",
        rf"EXITED after (?P<after_s>{_SECS}) s \(exit code unknown\)",
    ),
    Verdict.ERROR_IN_LOG: _forms(rf"ERROR_IN_LOG {_WHO}:(?: (?P<detail>.+))?"),
    Verdict.PREFLIGHT_FAILED: _forms(r"PREFLIGHT_FAILED (?P<check>[^:]*):(?: (?P<detail>.+))?"),
    Verdict.STOP_FAILED: _forms(
        rf"STOP_FAILED(?: survivors pid (?P<survivors>{_N}(?:, {_N})*))?(?:: (?P<detail>.+))?"
    ),
    Verdict.LAUNCH_FAILED: _forms(r"LAUNCH_FAILED(?: (?P<detail>.+))?"),
    Verdict.STALE_RECORD: _forms(
        rf"STALE_RECORD pid (?P<pid>{_N}) not signalled \(start time differs\); then: (?P<then>.+)"
    ),
    Verdict.CANCELLED: _forms(
        rf"CANCELLED after (?P<step>\S+){re.escape(_NOT_RELAUNCHED)}",
        rf"CANCELLED before stop{re.escape(_NOTHING_CHANGED)}",
    ),
    Verdict.INTERRUPTED: _forms(
        rf"INTERRUPTED after launch: {_WHO} (?P<state>running) (?P<seen>{_N})/(?P<expected>{_N}) \(unverified\)",
        rf"INTERRUPTED after launch: {_WHO} state (?P<state>unknown) \(unverified\)",
        rf"INTERRUPTED after launch: {_WHO} (?P<state>pending) \(unverified\)",
        rf"INTERRUPTED after launch: {_WHO} (?P<state>gone), (?P<seen>{_N})/(?P<expected>{_N}) \(unverified\)",
        rf"INTERRUPTED during (?P<step>\S+){re.escape(_OWNER_STOPPED)}",
        r"INTERRUPTED during (?P<step>\S+): (?P<detail>.+)",
    ),
}


#: regex group (named as its VerdictLine field) → how its text reads; the others are text
_READ: dict[str, Callable[[str], Any]] = {
    **dict.fromkeys(
        ("seen", "expected", "pid", "job_id", "nodes", "resumed_at", "ignored_checkpoint", "code"), int
    ),
    **dict.fromkeys(("reached", "lost"), lambda steps: int(steps.replace(",", ""))),
    **dict.fromkeys(("lost_s", "queued_s"), fmt.parse_duration),
    **dict.fromkeys(("after_s", "silent_s"), float),
    "survivors": lambda pids: tuple(int(p) for p in pids.split(", ")),
    "then": lambda line: parse_line(line),
}


def parse_line(text: str) -> VerdictLine:
    """The facts of a verdict line written by :func:`format_line` (which gives ``text`` back from them;
    surrounding whitespace is ignored).  ValueError if ``text`` is not a verdict line."""
    text = text.strip()
    head = text.split(" ", 1)[0].rstrip(":")
    try:
        verdict = Verdict(head)
    except ValueError:
        raise ValueError(f"not a verdict line (no verdict first): {text[:80]!r}") from None
    for form in _FORMS[verdict]:
        if m := form.match(text):
            facts = {k: _READ.get(k, str)(v) for k, v in m.groupdict().items() if v is not None}
            if (state := facts.pop("state", None)) is not None:  # after launch: no step group
                facts.update(step="launch", after_launch=True, state="alive" if state == "running" else state)
            if facts.get("reason") == "None":
                del facts["reason"]
            return VerdictLine(verdict, **facts)
    raise ValueError(f"not a {verdict} verdict line: {text[:120]!r}")
