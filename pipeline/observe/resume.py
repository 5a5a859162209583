"""Resume proof: did a new run start where the job's checkpoint left off?

Verify asks the host helper where the new run started (``start_step``) and for the newest
checkpoint in ``[jobs.NAME] checkpoint_dir``; :func:`check_resume` turns the two into the verdict
line's suffix (``resumed at step 12000``, or a warning that it started from step 0; the verdict
stays RUNNING).  Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline import fmt


@dataclass(frozen=True)
class ResumePoint:
    """The newest checkpoint of a job, as the host saw it."""

    path: str  #: the file that dates it (``latest.json``, or the newest file)
    step: int | None  #: None when its name has no number
    age_s: float  #: seconds from its mtime to the helper's clock (both host clock: no skew)

    @classmethod
    def from_helper(cls, raw: Mapping[str, Any] | None, host_time: float | None) -> ResumePoint | None:
        """From the helper's ``checkpoint`` answer (``{"step", "mtime", "file"}``) and its ``time``."""
        if not raw or raw.get("mtime") is None or host_time is None:
            return None
        step = int(raw["step"]) if raw.get("step") is not None else None
        return cls(str(raw.get("file") or "?"), step, host_time - raw["mtime"])


def check_resume(started_at: int | None, checkpoint: ResumePoint | None, since_launch_s: float) -> int | None:
    """The checkpoint step a new run that started at ``started_at`` (0: from scratch; None: not
    seen) should have resumed from but did not: it started from step 0 while a checkpoint with a
    step > 0 was there at its launch (older than ``since_launch_s``, the seconds from the launch to
    the check; one the new run wrote itself does not count).  None when it did not ignore one."""
    if started_at == 0 and checkpoint is not None and checkpoint.step and checkpoint.age_s >= since_launch_s:
        return checkpoint.step
    return None


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
