"""How a run looks to people: the live restart message and the verdict posted in its thread.

:func:`run_reply` is the headline message of a run (``run:r-42``), announced when the run is
created and updated in place after every step: who asked for what, with which patches, each
step with ✓/✗ and its duration (a step not yet due reads ``verify: waiting``), and the verdict
line once there is one.  :func:`verdict_reply` is the thread post carrying the verdict and its
evidence (the log tail).  Both are pure functions of the :class:`~pipeline.state.runs.RunRecord`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from handlers.commands import patch_phrase
from handlers.reply import Button, Reply, Status, StepLine, who
from handlers.text import SHOW_LOG_BUTTON
from pipeline.config import Config
from pipeline.errors import ExitCode
from pipeline.state.runs import RunRecord, StepRecord
from pipeline.verdict import Outcome, Step, Verdict

_WARNING_VERDICTS = frozenset({Verdict.CANCELLED, Verdict.INTERRUPTED, Verdict.PENDING})


def thread_key(run_id: str) -> str:
    """The key of a run's headline message and thread (``run:r-42``)."""
    return f"run:{run_id}"


def step_lines(run: RunRecord) -> tuple[StepLine, ...]:
    """The run's steps as :class:`StepLine` s, in order.

    A run whose launch ended well but whose verify step is not recorded yet (and has no
    verdict) gets a ``verify: waiting`` line, so the message always says what comes next.

    :returns: one line per recorded step (plus the waiting verify, when due).
    """
    lines = [
        StepLine(label=rec.step.value, outcome=rec.outcome.value, seconds=_seconds(rec), detail=rec.detail)
        for rec in run.steps
    ]
    if run.verdict is None and run.launched and run.step(Step.VERIFY) is None:
        lines.append(StepLine(label=Step.VERIFY.value, outcome=Outcome.WAITING.value))
    return tuple(lines)


def _seconds(rec: StepRecord) -> float | None:
    if rec.outcome in (Outcome.RUNNING, Outcome.WAITING):
        return None
    return rec.duration


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
    if run.verdict is not None:
        return run_verdict_fallback(run.id, run.job, run.verdict.value)
    return None


def run_reply(run: RunRecord, config: Config, *, notes: Sequence[str] = ()) -> Reply:
    """The live headline message of a run.

    Title: ``r-42: restart of dflash by <@U1> with topk patch, fresh cache``; then the steps;
    then ``notes`` (e.g. a lock-lost warning) and, when set, the verdict line last.

    :param run: the run as stored now.
    :param config: the configuration (for the job's host).
    :param notes: extra lines shown above the verdict line.
    :returns: a reply with ``thread_key`` ``run:<id>`` and ``run_id`` set.
    """
    fields: list[tuple[str, str]] = []
    job = config.jobs.get(run.job)
    if job is not None:
        fields.append(("host", job.host))
    if run.pid is not None:
        fields.append(("pid", str(run.pid)))
    if run.approved_by is not None:  # the two-person rule: who approved, and the patch bytes they saw
        fields.append(("approved by", run_approved(run.approved_by, run.approved_patches)))
    if run.break_glass is not None:
        fields.append(("break glass", run.break_glass))
    lines = list(notes)
    line = verdict_line(run)
    if line:
        lines.append(line)
    return Reply(
        title=run_headline(run.id, run.action, run.job, run.requested_by, run.patches, run.fresh_cache),
        status=run_status(run),
        steps=step_lines(run),
        lines=tuple(lines),
        fields=tuple(fields),
        thread_key=thread_key(run.id),
        run_id=run.id,
    )


def verdict_reply(run: RunRecord) -> Reply:
    """The thread post carrying a run's verdict: the verdict line as title, the evidence
    (log tail) as the log, status ok for RUNNING and error otherwise; a failed run offers a
    "Show log" button (``show_log``, value: the job).

    :param run: the run, with its verdict set (a run without one reads as an error).
    :returns: a reply with ``thread_key`` ``run:<id>`` and ``run_id`` set; its exit code is
        0 for RUNNING, 1 otherwise.
    """
    ok = run.verdict is not None and run.verdict.ok
    pending = run.verdict is Verdict.PENDING
    title = verdict_line(run) or run_verdict_fallback(run.id, run.job, "no verdict")
    return Reply(
        title=title,
        status=Status.OK if ok else Status.WARNING if pending else Status.ERROR,
        log=run.evidence or None,
        log_title=run_evidence_title(run.job) if run.evidence else "",
        thread_key=thread_key(run.id),
        run_id=run.id,
        buttons=() if ok or pending else (Button(SHOW_LOG_BUTTON, "show_log", run.job),),
        exit_code=ExitCode.OK if ok else ExitCode.PENDING if pending else ExitCode.FAILED,
    )


# --- text ---------------------------------------------------------------------------------------


def run_headline(
    run_id: str, action: str, job: str, user: str, patches: Sequence[str], fresh_cache: bool
) -> str:
    """The headline of a run's live message: ``r-42: restart of dflash by <@U1> with topk patch``."""
    extra = []
    if patches:
        extra.append(f"with {patch_phrase(patches)}")
    if fresh_cache:
        extra.append("fresh cache")
    tail = (" " + ", ".join(extra)) if extra else ""
    return f"{run_id}: {action} of {job} by {who(user)}{tail}"


def run_verdict_fallback(run_id: str, job: str, verdict: str) -> str:
    """A verdict line for a run whose record carries a verdict but no line."""
    return f"{run_id}: {job} {verdict}"


def run_evidence_title(job: str) -> str:
    """The title of the evidence (log tail) under a verdict."""
    return f"evidence from {job}"


def run_approved(by: str, hashes: Mapping[str, str]) -> str:
    """``<@U2> (topk sha256 1a2b3c4d5e6f)``: a run's approver and the patch hashes approved."""
    shown = ", ".join(f"{name} sha256 {sha[:12]}" for name, sha in sorted(hashes.items()))
    return who(by) + (f" ({shown})" if shown else "")
