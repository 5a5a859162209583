"""Resume proof: did a new run start where the job's checkpoint left off?

The verify step (:meth:`pipeline.engines.runner.Runner.verify`) asks the host helper where the new
run started (``start_step``: the step a ``resume_step=N`` / ``resumed at step N`` line names, else
the ranks' first metric steps) and for the newest checkpoint in ``[jobs.NAME] checkpoint_dir``.
:func:`check_resume` turns the two into the verdict line's suffix: ``resumed at step 12000``, or
``started from step 0 although checkpoint step 12000 exists`` — a warning posted in the run's
thread; the verdict itself stays RUNNING.  Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline import fmt


@dataclass(frozen=True)
class ResumePoint:
    """The newest checkpoint of a job, as the host saw it.

    :ivar path: the file that dates it (``latest.json``, or the newest file).
    :ivar step: its step (None when its name has no number).
    :ivar age_s: seconds between its mtime and the helper's clock when it answered (host clock
        on both sides, so clock skew between Pitstop and the host does not matter).
    """

    path: str
    step: int | None
    age_s: float

    @classmethod
    def from_helper(cls, raw: Mapping[str, Any] | None, host_time: float | None) -> ResumePoint | None:
        """From the helper's ``checkpoint`` answer (``{"step", "mtime", "file"}``) and its ``time``."""
        if not raw or raw.get("mtime") is None or host_time is None:
            return None
        step = raw.get("step")
        return cls(
            str(raw.get("file") or "?"), int(step) if step is not None else None, host_time - raw["mtime"]
        )


@dataclass(frozen=True)
class ResumeCheck:
    """Where a run started, measured against its checkpoint.

    :ivar started_at: the step it started from (0: from scratch), None when not seen.
    :ivar ignored: the checkpoint step it should have resumed from but did not, else None.
    """

    started_at: int | None
    ignored: int | None


def check_resume(
    started_at: int | None, checkpoint: ResumePoint | None, since_launch_s: float
) -> ResumeCheck:
    """Decide whether a new run ignored its checkpoint.

    A run ignored its checkpoint when it started from step 0 while a checkpoint with a step > 0
    was already there when it was launched (older than the time since the launch; one the new run
    wrote itself does not count).

    :param started_at: the step the run started from, None when unknown.
    :param checkpoint: the newest checkpoint, if any.
    :param since_launch_s: seconds from the launch to the check.
    :returns: where it started and the step it ignored, if it did.
    """
    ignored = None
    if started_at == 0 and checkpoint is not None and checkpoint.step and checkpoint.age_s >= since_launch_s:
        ignored = checkpoint.step
    return ResumeCheck(started_at, ignored)


__all__ = ["ResumeCheck", "ResumePoint", "check_resume"]


# --- text ---------------------------------------------------------------------------------------


def resume_warning(job: str, checkpoint_step: int, path: str) -> str:
    """The thread's warning for a run that ignored its checkpoint."""
    return (
        f"⚠ {job} started from step 0 although checkpoint step {checkpoint_step} exists ({path}): the run is training again from the start; "
        "check its --checkpoint-dir / resume option"
    )


def checkpoint_fact(path: str, step: int | None, age_s: float) -> str:
    """Evidence line: ``checkpoint /srv/ckpt/latest.json: step 12000, written 3 min before the check``."""
    what = f"step {step}" if step is not None else "no step in its name"
    return f"checkpoint {path}: {what}, written {fmt.duration(age_s)} before the check"
