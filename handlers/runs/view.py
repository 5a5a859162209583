"""How a run looks to people: the live restart message (:func:`run_reply`, ``run:r-42``, updated in
place after every step) and the verdict posted in its thread (:func:`verdict_reply`), both pure
functions of the :class:`~pipeline.state.runs.RunRecord`."""

from __future__ import annotations

from collections.abc import Sequence

from handlers.reply import Button, Reply, Status, StepLine
from handlers.text import SHOW_LOG_BUTTON, run_headline
from pipeline.config import Config
from pipeline.errors import ExitCode
from pipeline.fmt import who
from pipeline.state.runs import RunRecord
from pipeline.verdict import Outcome, Step, Verdict

_WARNING_VERDICTS = frozenset({Verdict.CANCELLED, Verdict.INTERRUPTED, Verdict.PENDING})


def thread_key(run_id: str) -> str:
    """The key of a run's headline message and thread (``run:r-42``)."""
    return f"run:{run_id}"


def run_note(run: RunRecord, title: str, status: Status, lines: tuple[str, ...] = ()) -> Reply:
    """A post in ``run``'s thread (``run:r-42``): a summary, a take-over, a follow-up, a warning."""
    return Reply(title=title, status=status, lines=lines, thread_key=thread_key(run.id), run_id=run.id)


def step_lines(run: RunRecord) -> tuple[StepLine, ...]:
    """The run's steps as :class:`StepLine` s, in order, plus ``verify: waiting`` for a run whose
    launch ended well but whose verify step is not recorded yet (and has no verdict)."""
    lines = [
        StepLine(
            label=rec.step.value,
            outcome=rec.outcome.value,
            seconds=None if rec.outcome in (Outcome.RUNNING, Outcome.WAITING) else rec.duration,
            detail=rec.detail,
        )
        for rec in run.steps
    ]
    if run.verdict is None and run.launched and run.step(Step.VERIFY) is None:
        lines.append(StepLine(label=Step.VERIFY.value, outcome=Outcome.WAITING.value))
    return tuple(lines)


def run_status(run: RunRecord) -> Status:
    """The tone of a run: ok once RUNNING, error for a failed verdict or step, warning when
    cancelled/interrupted, info while under way."""
    if run.verdict is not None:
        if run.verdict.ok:
            return Status.OK
        return Status.WARNING if run.verdict in _WARNING_VERDICTS else Status.ERROR
    if any(rec.outcome is Outcome.FAILED for rec in run.steps):
        return Status.ERROR
    return Status.INFO


def verdict_line(run: RunRecord) -> str | None:
    """The run's verdict line (a fallback built from the verdict when the record has none)."""
    if run.verdict_line:
        return run.verdict_line
    return f"{run.id}: {run.job} {run.verdict.value}" if run.verdict is not None else None


def run_reply(run: RunRecord, config: Config, *, notes: Sequence[str] = ()) -> Reply:
    """The live headline message of a run: ``r-42: restart of dflash by <@U1> with topk patch,
    fresh cache``, its steps, then ``notes`` (a lock-lost warning) and the verdict line, if any."""
    fields: list[tuple[str, str]] = []
    job = config.jobs.get(run.job)
    if job is not None:
        fields.append(("host", job.host))
    if run.pid is not None:
        fields.append(("pid", str(run.pid)))
    if run.approved_by is not None:  # the two-person rule: who approved, and the patch bytes they saw
        shown = ", ".join(f"{name} sha256 {sha[:12]}" for name, sha in sorted(run.approved_patches.items()))
        fields.append(("approved by", who(run.approved_by) + (f" ({shown})" if shown else "")))
    if run.break_glass is not None:
        fields.append(("break glass", run.break_glass))
    line = verdict_line(run)
    return Reply(
        title=run_headline(run),
        status=run_status(run),
        steps=step_lines(run),
        lines=(*notes, line) if line else tuple(notes),
        fields=tuple(fields),
        thread_key=thread_key(run.id),
        run_id=run.id,
    )


def verdict_reply(run: RunRecord) -> Reply:
    """The thread post carrying a run's verdict: the verdict line as title, the evidence (log tail)
    as the log; ok and exit code 0 for RUNNING, a warning for PENDING (exit code 6), else an error
    with a "Show log" button (``show_log``, value: the job), exit code 5 for CANCELLED and 1 for
    the others.  A run without a verdict reads as an error."""
    ok = run.verdict is not None and run.verdict.ok
    pending = run.verdict is Verdict.PENDING
    code = ExitCode.OK if ok else ExitCode.PENDING if pending else ExitCode.FAILED
    return Reply(
        title=verdict_line(run) or f"{run.id}: {run.job} no verdict",
        status=Status.OK if ok else Status.WARNING if pending else Status.ERROR,
        log=run.evidence or None,
        log_title=f"evidence from {run.job}" if run.evidence else "",
        thread_key=thread_key(run.id),
        run_id=run.id,
        buttons=() if ok or pending else (Button(SHOW_LOG_BUTTON, "show_log", run.job),),
        exit_code=ExitCode.CANCELLED if run.verdict is Verdict.CANCELLED else code,
    )
