"""The restart's steps (:class:`Step`, each ending with an :class:`Outcome`), its verdict (:class:`Verdict`)
and the verdict line: one owner that formats it and parses it.

The verdict line is a contract for people and scripts alike (``pitstop say --wait`` prints it,
the README lists its forms): one line, the verdict's name first, then the facts behind it; the
table of forms (``_TEMPLATES``) shows them all.

:class:`VerdictLine` holds the facts; :func:`format_line` writes the line, :func:`parse_line` reads
it back (``format_line(parse_line(s)) == s``), both from one table of forms (``_TEMPLATES``: each
``{name}`` a codec that writes a field and the regex that reads it); the engines write a line with
``str(VerdictLine(...))`` or a builder (:func:`stop_failed`, …).
Imports :mod:`pipeline.fmt` and the standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, replace
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
    #: the checkpoint pre-flight verified, when the run resumed at its step (RUNNING): ``3 files, 2.30 GiB``
    verified: str | None = None
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
    #: interrupted before any step; ``launch`` with ``state``)
    step: str | None = None
    #: INTERRUPTED after the launch (None: before it): ``alive``, ``gone``, ``unknown`` or ``pending``
    state: str | None = None
    #: free text: the log's error line, a failure's detail, what a probe found, a Slurm job's short nodes
    detail: str = ""
    then: VerdictLine | None = None  #: STALE_RECORD: the verdict the run had apart from the stale record
    #: the nodes a Slurm job runs on (RUNNING), named after their count when a restart excluded some
    nodelist: tuple[str, ...] = ()

    def __str__(self) -> str:
        return format_line(self)


# --- writing and reading: one table of forms ------------------------------------------------------


def one_line(text: str) -> str:
    """``text`` as one line: every run of whitespace (line breaks included) a single space, none at the ends."""
    return " ".join(text.split())


def _who(v: VerdictLine) -> str:
    return f"job {v.job_id}" if v.job_id is not None else f"pid {v.pid}"


def steps_of(n: int, role: str | None = None) -> str:
    """``1 step``, ``1,004 drafter steps``: ``n`` steps (of ``role``, when named) as a line says them."""
    word = f"{role} step" if role else "step"
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _lost_clause(v: VerdictLine) -> str | None:
    """``; the previous run reached drafter step 1,004 — 533 drafter steps (about 4 min of training)
    lost since the checkpoint of 00:32:01 UTC`` (the duration and the checkpoint's time when known)."""
    if v.reached is None or v.lost is None:
        return None
    role = one_line(v.lost_role or "").replace(" ", "_") or None
    text = f"; the previous run reached {role + ' ' if role else ''}step {v.reached:,} — {steps_of(v.lost, role)}"
    if v.lost and v.lost_s is not None and math.isfinite(v.lost_s) and v.lost_s >= 1:  # never "about 0 s"
        text += f" (about {fmt.duration(v.lost_s)} of training)"
    since = f" since the checkpoint of {one_line(v.checkpoint_at)}" if v.checkpoint_at else ""
    return f"{text} lost{since}"


def _where(v: VerdictLine) -> str | None:
    """A RUNNING line's who: ``pid 4242``, or a Slurm job and its nodes (``job 42 on 2 nodes``,
    ``job 42 on 2 nodes (n1, n3)`` when they are named)."""
    if v.job_id is None or v.nodes is None:
        return None if v.job_id is not None else _who(v)
    named = f" ({', '.join(v.nodelist)})" if v.nodelist else ""
    return f"job {v.job_id} on {v.nodes} node{'s' if v.nodes != 1 else ''}{named}"


def _step(v: VerdictLine) -> str:
    return one_line(v.step or "").replace(" ", "_")


def _secs(seconds: float) -> float:
    """Seconds as a line shows them: never negative (a host clock stepped back), never NaN."""
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _field(field: str, rx: str = "[0-9]+", show: Callable[[Any], str | None] = str) -> _Codec:
    """A field written by ``show`` (absent when None) and read back as the named group ``rx``."""
    return (lambda v: None if (x := getattr(v, field)) is None else show(x)), rf"(?P<{field}>{rx})"


def _state(state: str, text: str, rx: str) -> _Codec:
    return (lambda v: text if v.state is not None and state in (v.state, "gone") else None), rx


_Codec = tuple[Callable[["VerdictLine"], str | None], str]
_N = r"[0-9]+"
_GROUPED = r"[0-9]{1,3}(?:,[0-9]{3})*"
_LOST = (
    rf"; the previous run reached (?:(?P<lost_role>[A-Za-z0-9_.-]+) )?step (?P<reached>{_GROUPED})"
    rf" — (?P<lost>{_GROUPED}) (?:[A-Za-z0-9_.-]+ )?steps?(?: \(about (?P<lost_s>[^)]+) of training\))? lost"
    r"(?: since the checkpoint of (?P<checkpoint_at>.+))?"
)
#: a template's ``{name}`` → how a line writes it (None: this form does not apply), and the regex
#: (its groups named as VerdictLine fields) that reads it back
_CODECS: dict[str, _Codec] = {
    **{f: _field(f) for f in ("seen", "expected", "pid", "job_id", "ignored_checkpoint")},
    "code": _field("code", rf"-?{_N}"),
    "resumed_at": (lambda v: str(v.resumed_at) if v.resumed_at else None, rf"(?P<resumed_at>{_N})"),
    "verified": (
        lambda v: one_line(v.verified or "") or None,
        r"(?P<verified>[0-9]+ files?, [0-9.]+ [KMGT]?i?B)",
    ),
    "who": (_who, rf"(?:pid (?P<pid>{_N})|job (?P<job_id>{_N}))"),
    "where": (
        _where,
        rf"(?:pid (?P<pid>{_N})|job (?P<job_id>{_N}) on (?P<nodes>{_N}) nodes?"
        r"(?: \((?P<nodelist>[A-Za-z0-9_.-]+(?:, [A-Za-z0-9_.-]+)*)\))?)",
    ),
    "lost": (_lost_clause, _LOST),
    "all_lost": (lambda v: _lost_clause(v) if v.lost else None, _LOST),  # from scratch: none is no clause
    "silent_s": _field("silent_s", _N, lambda s: f"{_secs(s):.0f}"),
    "after_s": _field("after_s", r"[0-9]+(?:\.[0-9])?", lambda s: f"{_secs(s):.1f}"),
    "queued_s": _field("queued_s", r"[^)]+", lambda s: fmt.duration(_secs(s))),
    "reason": (lambda v: one_line(v.reason or "") or "None", r"(?P<reason>.+)"),
    "signal": _field("signal", r"\S+", lambda t: one_line(t) or None),
    "detail": _field("detail", ".+", lambda t: one_line(t) or None),
    "cut": (lambda v: one_line(v.detail)[:ERROR_LINE_LIMIT].rstrip() or None, "(?P<detail>.+)"),
    "check": (lambda v: one_line(v.check or "").replace(":", ""), "(?P<check>[^:]*)"),
    "survivors": (lambda v: ", ".join(map(str, v.survivors)) or None, rf"(?P<survivors>{_N}(?:, {_N})*)"),
    "then": (lambda v: None if v.then is None else format_line(v.then), "(?P<then>.+)"),
    "step": (lambda v: _step(v) or None, r"(?P<step>\S+)"),
    "during": (lambda v: None if v.state is not None else _step(v) or "start", r"(?P<step>\S+)"),
    "alive": _state("alive", "running", "(?P<state>running)"),
    "unknown": _state("unknown", "state unknown", "state (?P<state>unknown)"),
    "pending": _state("pending", "pending", "(?P<state>pending)"),
    "gone": _state("gone", "gone", "(?P<state>gone)"),
}
_COUNT = "{seen}/{expected} processes {who}"
_RUNNING = "RUNNING {seen}/{expected} processes {where}"
_AFTER_LAUNCH = "INTERRUPTED after launch: {who} "
#: each verdict's forms, the first that applies is written (and the first that matches read)
_TEMPLATES: dict[Verdict, tuple[str, ...]] = {
    Verdict.RUNNING: (
        _RUNNING + ", started from step 0 although checkpoint step {ignored_checkpoint} exists",
        _RUNNING + ", resumed at step {resumed_at} (checkpoint verified: {verified}){lost}",
        _RUNNING + ", resumed at step {resumed_at} (checkpoint verified: {verified})",
        _RUNNING + ", resumed at step {resumed_at}{lost}",
        _RUNNING + ", resumed at step {resumed_at}",
        _RUNNING + ", started from step 0{all_lost}",
        _RUNNING,
    ),
    Verdict.PENDING: ("PENDING reason {reason} (job {job_id} queued {queued_s})",),
    Verdict.WRONG_COUNT: ("WRONG_COUNT " + _COUNT + " ({detail})", "WRONG_COUNT " + _COUNT),
    Verdict.NO_PROGRESS: ("NO_PROGRESS " + _COUNT + " log silent {silent_s} s",),
    Verdict.EXITED: (
        "EXITED signal {signal} after {after_s} s",
        "EXITED code {code} after {after_s} s",
        "EXITED after {after_s} s (exit code unknown)",
    ),
    Verdict.ERROR_IN_LOG: ("ERROR_IN_LOG {who}: {cut}", "ERROR_IN_LOG {who}:"),
    Verdict.PREFLIGHT_FAILED: ("PREFLIGHT_FAILED {check}: {detail}", "PREFLIGHT_FAILED {check}:"),
    Verdict.STOP_FAILED: (
        "STOP_FAILED survivors pid {survivors}: {detail}",
        "STOP_FAILED survivors pid {survivors}",
        "STOP_FAILED: {detail}",
        "STOP_FAILED",
    ),
    Verdict.LAUNCH_FAILED: ("LAUNCH_FAILED {detail}", "LAUNCH_FAILED"),
    Verdict.STALE_RECORD: ("STALE_RECORD pid {pid} not signalled (start time differs); then: {then}",),
    Verdict.CANCELLED: (
        "CANCELLED after {step} - the job is stopped and was not relaunched",
        "CANCELLED before stop - nothing was changed",
    ),
    Verdict.INTERRUPTED: (
        _AFTER_LAUNCH + "{alive} {seen}/{expected} (unverified)",
        _AFTER_LAUNCH + "{unknown} (unverified)",
        _AFTER_LAUNCH + "{pending} (unverified)",
        _AFTER_LAUNCH + "{gone}, {seen}/{expected} (unverified)",
        "INTERRUPTED during {during}: {detail}",
        "INTERRUPTED during {during} - Pitstop stopped before the sequence finished",
    ),
}


def _form(template: str) -> tuple[str, list[str], re.Pattern[str]]:
    """A template, its ``{name}`` keys and the regex that reads what it writes."""
    parts = re.split(r"\{(\w+)\}", template)
    rx = "".join(_CODECS[p][1] if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return template, parts[1::2], re.compile(f"^{rx}$", re.ASCII)


_FORMS = {verdict: [_form(t) for t in templates] for verdict, templates in _TEMPLATES.items()}


def format_line(v: VerdictLine) -> str:
    """The one-line text of a verdict (the forms the builders show).

    Free text (``detail``, ``check``, ``reason``) is written on one line (:func:`one_line`) and
    seconds are never negative, so every line written reads back with :func:`parse_line`.

    :raises ValueError: if ``v`` lacks a field its verdict's line needs.
    """
    for template, keys, _ in _FORMS[v.verdict]:
        values = {key: _CODECS[key][0](v) for key in keys}
        if None not in values.values():
            return template.format(**values)
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
        names = ("reached", "lost", "lost_role", "lost_s", "checkpoint_at")
        return replace(line, **dict(zip(names, astuple(self), strict=True)))


# --- the builders the engines call -----------------------------------------------------------------


def preflight_failed(check: str, detail: str) -> str:
    """``PREFLIGHT_FAILED patch: topk does not apply: …``."""
    return format_line(VerdictLine(Verdict.PREFLIGHT_FAILED, check=check, detail=detail))


def stop_failed(survivors: Sequence[int], detail: str) -> str:
    """``STOP_FAILED survivors pid 4242, 4243: …``."""
    return format_line(VerdictLine(Verdict.STOP_FAILED, survivors=tuple(survivors), detail=detail))


def launch_failed(detail: str) -> str:
    """``LAUNCH_FAILED cannot start ./run.sh: …``."""
    return format_line(VerdictLine(Verdict.LAUNCH_FAILED, detail=detail))


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
    line = VerdictLine(Verdict.INTERRUPTED, seen, expected, pid, job_id, step="launch", state=state)
    return format_line(line)


#: regex group (named as its VerdictLine field) → how its text reads; the others are text
_READ: dict[str, Callable[[str], Any]] = {
    **dict.fromkeys(
        ("seen", "expected", "pid", "job_id", "nodes", "resumed_at", "ignored_checkpoint", "code"), int
    ),
    **dict.fromkeys(("reached", "lost"), lambda steps: int(steps.replace(",", ""))),
    **dict.fromkeys(("lost_s", "queued_s"), fmt.parse_duration),
    **dict.fromkeys(("after_s", "silent_s"), float),
    "survivors": lambda pids: tuple(int(p) for p in pids.split(", ")),
    "nodelist": lambda nodes: tuple(nodes.split(", ")),
    "then": lambda line: parse_line(line),
    "reason": lambda reason: None if reason == "None" else reason,
}


def parse_line(text: str) -> VerdictLine:
    """The facts of a verdict line written by :func:`format_line` (which gives ``text`` back from them;
    surrounding whitespace is ignored).  ValueError if ``text`` is not a verdict line."""
    text = text.strip()
    if (head := text.split(" ", 1)[0].rstrip(":")) not in Verdict.__members__:
        raise ValueError(f"not a verdict line (no verdict first): {text[:80]!r}")
    verdict = Verdict(head)
    for _, _, form in _FORMS[verdict]:
        if m := form.match(text):
            facts = {k: _READ.get(k, str)(v) for k, v in m.groupdict().items() if v is not None}
            if (state := facts.pop("state", None)) is not None:  # after launch: no step group
                facts.update(step="launch", state="alive" if state == "running" else state)
            return VerdictLine(verdict, **facts)
    raise ValueError(f"not a {verdict} verdict line: {text[:120]!r}")
