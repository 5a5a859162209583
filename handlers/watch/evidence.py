"""The evidence an incident carries: why the job died (and may it be restarted automatically?),
and why it hangs.

:func:`check_crash` classifies what the job's current run wrote since its launch, with its
launcher's exit status (:func:`pipeline.observe.crashes.classify`), and remembers the last crash
per job in Redis, so a Python exception that comes back with the same type at the same step in
the *next* run is recognised as a repeat.  :func:`refusal` applies ``[jobs.NAME.watch]
auto_restart``: no automatic restart for a class not in ``on``, nor for a repeating exception.

Evidence for a hang (:func:`post_hang_evidence`), posted in a stuck-rank or stalled incident's
thread once it opens, is what a person would run by hand on the host, in one look by the job's engine
(:meth:`~pipeline.engines.runner.Runner.hang_evidence`): each stuck process's state and
``wchan`` from ``/proc``, and its Python stacks from ``py-spy dump --pid PID`` when py-spy is
installed there.  A process in uninterruptible sleep (``D``) cannot be killed, so the post says a
restart will not free it and the host may need recycling.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.text import HANG_STACKS_TITLE, alert_exit_cause, exit_code_refusal
from pipeline.config import AutoRestart
from pipeline.config.jobs import SCHEDULED, CrashClass, ExitPolicy
from pipeline.engines.base import Sighting
from pipeline.errors import PitstopError
from pipeline.host.contract import HangAnswer
from pipeline.observe.checkpoints import list_checkpoints
from pipeline.observe.crashes import Crash, at_time_limit, classify, from_fields
from pipeline.observe.evidence import ended
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CrashCheck:
    """A classified failure of the job's current run."""

    crash: Crash
    repeat: bool  #: the previous run failed with the same Python exception type at the same step
    exit_cause: str | None  #: how the launched process ended, when its waiter recorded it
    node: str | None = None  #: the node the failing rank (else the first rank) ran on, when known


async def check_crash(ctx: Context, name: str, sight: Sighting | None = None) -> CrashCheck | None:
    """Classify how the job's current run failed, from all ranks' log bytes since its launch, and
    how its scheduler says it ended (the sighting's ``end_state``, ``exit_code``).

    :param sight: the watch cycle's sighting of the job: when its probe brought the job's ending,
        it is used instead of asking the job's engine again
        (:meth:`~pipeline.engines.runner.Runner.crash_evidence`).
    :returns: the check, or None when the job has no recorded run or the host cannot be read.
    """
    store = ctx.redis.open_store(IncidentStore)
    seen = sight.probe if sight is not None else None
    try:
        current = (await ctx.service.jobs.read(name)).current
        run_id = current.get("run_id")
        if not run_id:
            return None
        run = await ctx.runs.get(run_id)
        offset = run.log_size_at_launch or 0
        seen = await ctx.restarter.on_job(name, lambda e, t: e.crash_evidence(t, offset, seen))
        how = ended(seen.state, seen.exit_status)  # the waiter's record
        signal, code = (how.signal, how.code) if how else (None, None)
        code = sight.exit_code if code is None and signal is None and sight is not None else code
        exit_cause = alert_exit_cause(code, signal) if how else None
        stored = await store.last_crash(name)
        previous = from_fields(stored)
        if stored.get("run_id") == run_id and previous is not None:  # this run, seen before
            return CrashCheck(previous, stored.get("repeat") == "1", exit_cause, _node(previous, sight))
        data = seen.crash.data if seen.crash is not None else b""  # (an engine always reads it)
    except PitstopError as exc:
        log.info("crash check %s: %s", name, exc.message)
        return None
    pid = current.get("pid")
    crash = classify(
        data,
        exit_signal=signal,
        exit_code=code,
        pids=[int(pid)] if pid and pid.isdigit() else [],
        kernel=seen.kernel,
        kernel_unreadable=seen.kernel_unreadable,
        end_state=sight.end_state if sight is not None else None,
    )
    if crash.kind is CrashClass.TIME_LIMIT:
        crash = at_time_limit(crash, await _newest_checkpoint(ctx, name))
    repeat = previous is not None and previous.same_failure(crash)
    fields = {**crash.to_fields(), "run_id": run_id, "repeat": "1" if repeat else "0"}
    await store.remember_crash(name, fields)
    return CrashCheck(crash, repeat, exit_cause, _node(crash, sight))


async def _newest_checkpoint(ctx: Context, name: str) -> int | None:
    """The step of job ``name``'s newest intact checkpoint (its manifests, as pre-flight reads
    them); None when it has none or the host cannot say (logged)."""
    try:
        found = await list_checkpoints(ctx.ssh, name, ctx.config.jobs[name])
    except PitstopError as exc:
        log.info("checkpoints of %s: %s", name, exc.message)
        return None
    return next((c.step for c in found if c.intact), None)


def _node(crash: Crash, sight: Sighting | None) -> str | None:
    """The node ``crash``'s failing rank ran on (ranks in blocks of ``expected / nodes`` per node,
    Slurm's default distribution; no rank: the first node), None when the nodes are unknown."""
    if sight is None or not sight.nodes:
        return None
    per_node = max(1, -(-sight.expected // len(sight.nodes)))
    return sight.nodes[min(len(sight.nodes) - 1, (crash.rank or 0) // per_node)]


def elsewhere(check: CrashCheck | None, exit_codes: Mapping[int, ExitPolicy]) -> tuple[str, ...]:
    """The nodes the automatic restart after ``check`` leaves out: the failing rank's node when
    the job's own exit code is ``restart_elsewhere`` in ``exit_codes`` and that node is known;
    else none."""
    if check is None or check.node is None or check.crash.exit_code is None:
        return ()
    return (check.node,) if exit_codes.get(check.crash.exit_code) is ExitPolicy.RESTART_ELSEWHERE else ()


def refusal(
    job: str,
    check: CrashCheck,
    policy: AutoRestart | None,
    exit_codes: Mapping[int, ExitPolicy] | None = None,
) -> str | None:
    """Why the job must not be restarted automatically after this crash, or None if it may.

    A preemption or a time limit (:data:`~pipeline.config.jobs.SCHEDULED`) is never refused; a
    job's own exit code that ``exit_codes`` maps to ``no_restart`` always is, and one it maps to
    ``restart_elsewhere`` is restarted whatever ``auto_restart.on`` says.

    :param policy: the job's ``auto_restart`` (None: no automatic restarts at all — nothing to refuse).
    :param exit_codes: the job's ``exit_codes`` (None: none).
    """
    if policy is None:
        return None
    crash = check.crash
    wants = (exit_codes or {}).get(crash.exit_code) if crash.exit_code is not None else None
    if crash.kind in SCHEDULED or wants is ExitPolicy.RESTART_ELSEWHERE:
        return None
    if wants is ExitPolicy.NO_RESTART and crash.exit_code is not None:
        return exit_code_refusal(job, crash.exit_code, crash.summary)
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


KINDS = (IncidentKind.STUCK_RANK, IncidentKind.STALLED)  #: incidents that get hang evidence
_STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep", "T": "stopped", "Z": "zombie"}


async def post_hang_evidence(ctx: Context, inc: Incident, channel: str | None) -> None:
    """Post the hang evidence of ``inc``'s job (the stuck rank's process, or all) in its thread, if
    it is a stuck-rank or stalled incident (:data:`KINDS`) and the host could be asked (else logged).

    :param inc: a numbered incident.
    :param channel: its job's channel (None: the announce channel).
    """
    if inc.kind not in KINDS:
        return
    pids = [inc.rank_pid] if inc.kind is IncidentKind.STUCK_RANK and inc.rank_pid is not None else []
    try:
        answer = await ctx.restarter.on_job(inc.job, lambda e, t: e.hang_evidence(t, pids))
    except PitstopError as exc:
        log.warning("hang evidence for %s: %s", inc.job, exc.message)
        return
    await ctx.outbox.thread(inc.thread_key, hang_reply(inc, answer), channel)


def hang_reply(inc: Incident, answer: HangAnswer) -> Reply:
    """The post from the helper's ``hang`` answer (pure; see :func:`post_hang_evidence`)."""
    procs = answer.get("processes") or []
    who = f"rank {inc.rank}" if inc.kind is IncidentKind.STUCK_RANK and inc.rank is not None else inc.job
    lines: list[str] = []
    stacks: list[str] = []
    unkillable = False
    for p in procs:
        pid, state, stack, stack_error = p["pid"], p.get("state"), p.get("stack"), p.get("stack_error")
        what = f"{state} ({_STATES.get(state, '?')})" if state else "gone"
        lines.append(f"pid {pid} `{p.get('cmdline') or ''}`: state {what}, wchan {p.get('wchan') or '-'}")
        unkillable |= state == "D"
        if stack:
            stacks.append(f"py-spy dump --pid {pid}\n{stack}")
        elif stack_error:
            lines.append(f"py-spy dump --pid {pid} failed: {stack_error}")
    if not procs:
        lines.append(f"no process of {inc.job} found on the host")
    if answer.get("py_spy") is None:
        lines.append(
            f"py-spy is not installed on {inc.host}, so no Python stacks: `pip install py-spy` there"
        )
    if unkillable:
        lines.append(
            f"a process in uninterruptible sleep (D) cannot be killed: a restart will not free {who}; "
            "the host may need recycling"
        )
    return Reply(
        title=f"hang evidence for {who}: {len(procs)} process{'es' if len(procs) != 1 else ''} on the host",
        status=Status.ERROR if unkillable else Status.WARNING,
        lines=tuple(lines),
        log="\n\n".join(stacks) or None,
        log_title=HANG_STACKS_TITLE if stacks else "",
        thread_key=inc.thread_key,
    )
