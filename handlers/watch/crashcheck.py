"""Why did the job die, and may it be restarted automatically? (the watcher's crash classes)

:func:`check_crash` classifies what the job's current run wrote since its launch, with its
launcher's exit status (:func:`pipeline.observe.crashes.classify`), and remembers the last crash
per job in Redis, so a Python exception that comes back with the same type at the same step in
the *next* run is recognised as a repeat.  :func:`refusal` applies ``[jobs.NAME.watch]
auto_restart``: no automatic restart for a class not in ``on``, nor for a repeating exception.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from handlers.context import Context
from handlers.text import alert_exit_cause
from pipeline.config import AutoRestart
from pipeline.config.watch import CrashClass
from pipeline.errors import PitstopError
from pipeline.host.probe import JobProbe
from pipeline.observe.crashes import Crash, classify, from_fields
from pipeline.observe.evidence import ended
from pipeline.state.incidents import Incident, IncidentStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CrashCheck:
    """A classified failure of the job's current run."""

    crash: Crash
    repeat: bool  #: the previous run failed with the same Python exception type at the same step
    exit_cause: str | None  #: how the launched process ended, when its waiter recorded it


async def check_crash(ctx: Context, name: str, seen: JobProbe | None = None) -> CrashCheck | None:
    """Classify how the job's current run failed, from all ranks' log bytes since its launch.

    :param seen: the watch cycle's probe of the job: when it brought the job's ending, it is used
        instead of asking the job's engine again
        (:meth:`~pipeline.engines.runner.Runner.crash_evidence`).
    :returns: the check, or None when the job has no recorded run or the host cannot be read.
    """
    store = ctx.redis.open_store(IncidentStore)
    try:
        current = (await ctx.service.jobs.read(name)).current
        run_id = current.get("run_id")
        if not run_id:
            return None
        run = await ctx.runs.get(run_id)
        offset = run.log_size_at_launch or 0
        seen = await ctx.restarter.crash_evidence(name, offset, seen)
        how = ended(seen.state, seen.exit_status)  # the waiter's record
        signal, code = (how.signal, how.code) if how else (None, None)
        exit_cause = alert_exit_cause(code, signal) if how else None
        stored = await store.last_crash(name)
        previous = from_fields(stored)
        if stored.get("run_id") == run_id and previous is not None:
            return CrashCheck(previous, stored.get("repeat") == "1", exit_cause)  # this run, seen before
        data = seen.crash.data if seen.crash is not None else b""  # (an engine always reads it)
    except PitstopError as exc:
        log.info("crash check %s: %s", name, exc.message)
        return None
    crash = classify(data, exit_signal=signal, exit_code=code)
    repeat = previous is not None and previous.same_failure(crash)
    fields = {**crash.to_fields(), "run_id": run_id, "repeat": "1" if repeat else "0"}
    await store.remember_crash(name, fields)
    return CrashCheck(crash, repeat, exit_cause)


def refusal(job: str, check: CrashCheck, policy: AutoRestart | None) -> str | None:
    """Why the job must not be restarted automatically after this crash, or None if it may.

    :param policy: the job's ``auto_restart`` (None: no automatic restarts at all — nothing to refuse).
    """
    if policy is None:
        return None
    crash = check.crash
    if check.repeat and crash.kind is CrashClass.PYTHON_EXCEPTION:
        return (
            f"{job} failed again with {crash.exc_type or '?'} at step {crash.step} - the same exception at "
            "the same step is a bug a restart will not fix, so no more automatic restarts; fix it and "
            f"restart by hand. Cause: {crash.summary}"
        )
    if crash.kind not in policy.on:
        return (
            f"{job} failed with {crash.kind.value} - not restarted automatically ({crash.kind.value} is not "
            f"in auto_restart.on); restart it by hand once the cause is fixed. Cause: {crash.summary}"
        )
    return None


def with_crash(inc: Incident, check: CrashCheck) -> Incident:
    """The incident with the crash's class, evidence line (the alert's cause) and details."""
    c = check.crash
    details = {f"crash_{k}": getattr(c, k) for k in ("evidence", "exc_type", "message", "rank", "step")}
    cause = {
        "crash_class": c.kind.value,
        "cause": c.summary,
        "exit_cause": check.exit_cause or inc.exit_cause,
    }
    return inc.model_copy(update={**details, **cause})
