"""The watcher's rules: what one probe saw of a job in, the incident transitions to make out.

:func:`assess` (pure, time passed in) turns an :class:`Observation` plus a :class:`Situation` into
a :class:`Decision`; :class:`pipeline.state.incidents.IncidentStore` applies it once (a
compare-and-set: where an alert is de-duplicated) and :mod:`handlers.watch.cycle` posts it.

Conditions, in precedence order (``stuck_rank``, ``stalled`` and ``idle_gpus`` not during
``warmup`` s after a launch):

- ``unreachable``: the host could not be reached, over a fresh connection too, in
  ``unreachable_after`` cycles spanning at least 2 intervals (fewer: ``probe_failed``); it never
  leads to an automatic restart;
- ``queued``: requeued by the scheduler (a preemption) and PENDING for ``pending_after`` s (until
  then, and while it is being preempted, the scheduler holds it: ``in_flight``, never ``dead``);
  resolved once it runs;
- ``dead``: no process while the job should run (a RUNNING verdict or seen alive, and not
  stopped on purpose since);
- ``degraded``: fewer than ``processes`` (but some) for ``degraded_after`` s;
- ``stuck_rank``: :mod:`pipeline.observe.progress`'s stuck rank;
- ``stalled``: no rank's step advanced for ``stall_after`` s (a log without steps: no new bytes);
- ``loss_nan``: a rank logged a NaN or infinite loss; with ``on_loss_nan = "stop"`` the job is
  stopped too (a ``stop`` action after the alert);
- ``loss_spike``: a rank's loss stayed above ``loss_spike`` × its rolling median for
  ``loss_spike_steps`` steps (both: :mod:`pipeline.observe.loss`; an open one stays while the
  metric log cannot be read);
- ``idle_gpus`` (opt-in): some GPUs under ``idle_gpu_below`` percent for ``idle_gpu_for`` s
  (:mod:`pipeline.observe.idle`);
- ``crash_loop``: dead again after ``auto_restart.max`` automatic restarts within ``within``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pipeline.config import JobConfig
from pipeline.config.jobs import WatchSettings
from pipeline.observe.idle import GpuReading, idle_facts, idle_since
from pipeline.observe.loss import loss_facts
from pipeline.observe.progress import Judgement, stuck_facts
from pipeline.state.incidents import Incident, IncidentKind, WatchState

DEFAULT_REMIND_EVERY = 1800.0  #: seconds between reminders of an open, unacknowledged incident


class ActionKind(StrEnum):
    """An incident transition decided by :func:`assess`."""

    OPEN = "open"  #: a new incident: post the alert
    CHANGE = "change"  #: the open incident became another kind (degraded → dead)
    REMIND = "remind"  #: re-post in the incident's thread (not acknowledged)
    RESOLVE = "resolve"  #: the job is healthy again (or was stopped on purpose)
    AUTO_RESTART = "auto_restart"  #: restart the job through the locked sequence
    GIVE_UP = "give_up"  #: crash loop: no more automatic restarts
    STOP = "stop"  #: stop the job (a NaN loss under ``on_loss_nan = "stop"``)


@dataclass(frozen=True)
class Observation:
    """What one probe cycle saw of one job, ``at`` (unix s)."""

    at: float
    reachable: bool = True  #: False when the host could not be reached, over a fresh connection too
    count: int = 0  #: matching processes
    pids: tuple[int, ...] = ()  #: the launched one first (the recorded session leader, else the lowest)
    log_size: int | None = None  #: bytes in the job's log (and metric log); None: unreadable
    exit_cause: str | None = None  #: how the last process ended, when the host knows (``SIGKILL``)
    error: str | None = None  #: why the host could not be reached
    detail: str | None = None  #: the engine's words beside the count (Slurm: nodes short), the ``cause``
    progress: Judgement | None = None  #: the ranks' step progress; None if not read
    gpus: tuple[GpuReading, ...] | None = None  #: the idle rule's GPUs; None when not watched or read
    probe_s: float | None = None  #: seconds the probe of the job's host took (:func:`probe_slow`)


def probe_slow(probe_s: float | None, cfg: JobConfig) -> bool:
    """Whether a probe that took ``probe_s`` seconds was slower than the job's watch interval (its
    host's cycles then run late: APScheduler skips the ticks that fall while one runs)."""
    return probe_s is not None and probe_s > cfg.watch.interval


@dataclass(frozen=True)
class Situation:
    """What Pitstop knows about a job beyond the probe."""

    in_flight: bool = False  #: a restart/start/stop runs or awaits its verification
    stopped_at: float | None = None  #: when the job was stopped on purpose, if that is its newest run
    running_verdict: bool = False  #: the newest run's verdict is RUNNING
    auto_restarts: int = 0  #: automatic restarts within ``auto_restart.within`` so far
    launched_at: float | None = None  #: when the newest run was launched (for ``watch.warmup``)
    #: seconds the job has been PENDING since the scheduler requeued it (None: it is not), and why
    queued_for: float | None = None
    pending_reason: str | None = None


@dataclass(frozen=True)
class Action:
    """One incident transition; ``incident`` is the incident as it is after the action."""

    kind: ActionKind
    incident: Incident
    previous: IncidentKind | None = None  #: the kind before a CHANGE


@dataclass(frozen=True)
class Decision:
    """The outcome of one cycle for one job."""

    state: WatchState  #: the watcher memory to save
    incident: Incident | None  #: the open incident after the actions (None if none or resolved)
    actions: tuple[Action, ...]  #: the transitions to apply, in order
    condition: str  #: ``ok``, ``pending``, ``idle``, ``in_flight`` or an :class:`IncidentKind` value


def assess(
    job: str,
    cfg: JobConfig,
    obs: Observation,
    state: WatchState,
    incident: Incident | None,
    situation: Situation,
    *,
    remind_every: float = DEFAULT_REMIND_EVERY,
) -> Decision:
    """Decide one watch cycle for one job (the conditions: module docstring); ``obs.at`` is "now",
    ``state`` the watcher memory from the previous cycle, ``incident`` the job's open one."""
    now, w = obs.at, cfg.watch
    actions: list[Action] = []

    def done(inc: Incident | None, condition: str, *acts: Action) -> Decision:
        return Decision(st, inc, (*actions, *acts), str(condition))

    def remind(inc: Incident, condition: str) -> Decision:
        """Re-post an open incident nobody acknowledged, every ``remind_every`` s."""
        if inc.acked_by is not None or now - inc.notified_at < remind_every:
            return done(inc, condition)
        inc = inc.model_copy(update={"notified_at": now})
        return done(inc, condition, Action(ActionKind.REMIND, inc))

    def opened(kind: IncidentKind, **facts: Any) -> Decision:
        new = Incident(job=job, host=cfg.host, kind=kind, opened_at=now, notified_at=now, **facts)
        new = _plan_auto_restart(new, cfg, situation, now)
        return done(new, kind, Action(ActionKind.OPEN, new), *_stop(new, w.on_loss_nan))

    if not obs.reachable:
        since = state.unreachable_since if state.unreachable_since is not None else now
        fails = (state.probe_failures or 0) + 1
        st = state.model_copy(update={"probe_failures": fails, "unreachable_since": since})
        if fails < w.unreachable_after or now - since < 2 * w.interval:
            return done(incident, "probe_failed")  # one lost probe is no verdict
        if incident is not None:
            return remind(incident, IncidentKind.UNREACHABLE)
        known = {"expected": cfg.processes, **st.model_dump(include={"last_pid", "last_alive_at"})}
        return opened(IncidentKind.UNREACHABLE, count=st.last_count or 0, error=obs.error, **known)

    st = state.model_copy(update={"probe_failures": None, "unreachable_since": None, "probe_s": obs.probe_s})
    if incident is not None and incident.kind is IncidentKind.UNREACHABLE:
        resolved = incident.model_copy(update={"resolved_at": now, "resolution": "reachable"})
        actions.append(Action(ActionKind.RESOLVE, resolved))
        incident = None

    if obs.count > 0:
        st.last_alive_at, st.last_count = now, obs.count
        st.last_pid = obs.pids[0] if obs.pids else st.last_pid
    st.exit_cause = obs.exit_cause or st.exit_cause
    wrote = obs.log_size is not None and obs.log_size != st.log_size  # grew, or rotated/truncated
    # the job wrote, no baseline yet, nothing running to stall, or a planned restart (no alerts:
    # progress and degradation are measured from its end)
    if wrote or st.progress_at is None or obs.count == 0 or situation.in_flight:
        st.progress_at = now
    st.log_size = obs.log_size if obs.log_size is not None else st.log_size
    if obs.count == 0 or obs.count >= cfg.processes or situation.in_flight:
        st.degraded_since = None
    elif st.degraded_since is None:
        st.degraded_since = now

    # requeued by the scheduler: PENDING too long is an incident, one that resolves once it runs
    queued = incident is not None and incident.kind is IncidentKind.QUEUED
    if situation.queued_for is not None and situation.queued_for >= w.pending_after:
        if incident is None:
            why = situation.pending_reason
            return opened(IncidentKind.QUEUED, count=0, expected=cfg.processes, cause=why)
        if queued:
            return remind(incident, IncidentKind.QUEUED)
    elif queued and incident is not None and situation.queued_for is None and obs.count > 0:
        ran = {"resolved_at": now, "resolution": "running", "count": obs.count}
        actions.append(Action(ActionKind.RESOLVE, incident.model_copy(update=ran)))
        incident = None

    if situation.in_flight:
        st.idle_gpus_since = None
        if incident is not None and incident.next_auto_at is not None:
            incident = incident.model_copy(update={"next_auto_at": None})
        return done(incident, "in_flight")

    # should it run: a RUNNING verdict or seen alive, and not stopped on purpose since
    stopped = situation.stopped_at is not None and (st.last_alive_at or 0.0) <= situation.stopped_at
    expected = not stopped and (situation.running_verdict or st.last_alive_at is not None)
    warming = situation.launched_at is not None and now - situation.launched_at < w.warmup
    steps = obs.progress if obs.progress is not None and obs.progress.known else None
    idle = _idle_gpus(st, w, obs, warming)
    # GPUs not read this cycle (nvidia-smi failed): an open idle incident stays as it is
    unread = w.idle_gpu_below is not None and obs.gpus is None and bool(st.idle_gpus_since)
    kept = unread and incident is not None and incident.kind is IncidentKind.IDLE_GPUS
    # the metric log not read this cycle: an open loss incident stays as it is
    loss = obs.progress.loss if obs.progress is not None else None
    losing = incident is not None and incident.kind in _LOSS and obs.progress is None
    loss_kind = loss.kind if loss is not None else incident.kind if incident is not None and losing else None
    # the ranks' steps (not while warming up), else the log's bytes (:mod:`pipeline.observe.progress`)
    silent = now - (st.progress_at or now) if steps is None else 0.0 if warming else steps.frozen_for or 0.0
    degraded = st.degraded_since is not None and now - st.degraded_since >= w.degraded_after
    rules: tuple[tuple[bool, IncidentKind | str], ...] = (  # in precedence order
        (obs.count == 0, IncidentKind.DEAD if expected else "idle"),
        (degraded, IncidentKind.DEGRADED),
        (not warming and steps is not None and bool(steps.stuck), IncidentKind.STUCK_RANK),
        (silent >= w.stall_after, IncidentKind.STALLED),
        (loss_kind is IncidentKind.LOSS_NAN, IncidentKind.LOSS_NAN),
        (loss_kind is IncidentKind.LOSS_SPIKE, IncidentKind.LOSS_SPIKE),
        (bool(idle) or kept, IncidentKind.IDLE_GPUS),
        (obs.count < cfg.processes, "pending"),
    )
    condition = next((kind for hit, kind in rules if hit), "ok")

    last = st.model_dump(include={"last_pid", "last_alive_at", "exit_cause"})
    facts: dict[str, Any] = {"count": obs.count, "expected": cfg.processes, **last}
    facts.update({"cause": obs.detail} if obs.detail else {})
    if condition is IncidentKind.STUCK_RANK and steps is not None:
        facts.update(stuck_facts(steps, cfg.host))
    if condition in _LOSS and loss is not None:
        facts.update(loss_facts(loss, w))
    if condition is IncidentKind.IDLE_GPUS and obs.gpus and w.idle_gpu_below is not None:
        facts.update(idle_facts(idle, len(obs.gpus), st.idle_gpus_since or {}, w.idle_gpu_below, now))
    if incident is None:
        return opened(condition, **facts) if isinstance(condition, IncidentKind) else done(None, condition)
    if condition == "ok" or condition == "idle":
        why = "running" if condition == "ok" else "stopped"
        resolved = incident.model_copy(update={"resolved_at": now, "resolution": why, **facts})
        return done(None, condition, Action(ActionKind.RESOLVE, resolved))
    current = incident.kind
    if condition == "pending" or (current is IncidentKind.CRASH_LOOP and condition is IncidentKind.DEAD):
        return remind(incident, condition)
    if condition is not current:
        changed = incident.model_copy(update={"kind": condition, "changed_at": now, **facts})
        changed = _plan_auto_restart(changed, cfg, situation, now)
        change = Action(ActionKind.CHANGE, changed, previous=current)
        return done(changed, condition, change, *_stop(changed, w.on_loss_nan))

    # the same condition persists: maybe restart automatically, maybe remind
    if condition is IncidentKind.DEAD and w.auto_restart is not None and not incident.gave_up:
        if incident.no_auto:  # its crash class is not restarted automatically: say so, once
            incident = incident.model_copy(update={"gave_up": True, "next_auto_at": None, "changed_at": now})
        incident = _plan_auto_restart(incident, cfg, situation, now)  # or a crash loop, given up
        if incident.gave_up:
            return done(incident, incident.kind, Action(ActionKind.GIVE_UP, incident))
        if incident.next_auto_at is not None and now >= incident.next_auto_at:
            fired = incident.model_copy(
                update={"next_auto_at": None, "auto_restarts": incident.auto_restarts + 1}
            )
            return done(fired, condition, Action(ActionKind.AUTO_RESTART, fired))
    return remind(incident, condition)


_LOSS = (IncidentKind.LOSS_NAN, IncidentKind.LOSS_SPIKE)


def _stop(incident: Incident, policy: str) -> tuple[Action, ...]:
    """The stop that follows a ``loss_nan`` incident's alert under ``on_loss_nan = "stop"``."""
    wanted = incident.kind is IncidentKind.LOSS_NAN and policy == "stop"
    return (Action(ActionKind.STOP, incident),) if wanted else ()


def _idle_gpus(st: WatchState, w: WatchSettings, obs: Observation, warming: bool) -> list[GpuReading]:
    """Carry each watched GPU's idle start in ``st`` and return those idle for ``idle_gpu_for`` s;
    nothing running or warming up forgets them, GPUs not read keep them."""
    below, idle_for = w.idle_gpu_below, w.idle_gpu_for
    if below is None or idle_for is None or obs.count == 0 or warming:
        st.idle_gpus_since = None
        return []
    if obs.gpus is None:
        return []
    since = st.idle_gpus_since = idle_since(obs.gpus, below, st.idle_gpus_since or {}, obs.at) or None
    return [r for r in obs.gpus if since and r.index in since and obs.at - since[r.index] >= idle_for]


def _plan_auto_restart(incident: Incident, cfg: JobConfig, situation: Situation, now: float) -> Incident:
    """Schedule the next automatic restart of a dead job, or mark the crash loop given up."""
    policy = cfg.watch.auto_restart
    if policy is None or incident.kind is not IncidentKind.DEAD or incident.gave_up or incident.no_auto:
        return incident
    if situation.auto_restarts >= policy.max:
        return incident.model_copy(
            update={"kind": IncidentKind.CRASH_LOOP, "gave_up": True, "next_auto_at": None, "changed_at": now}
        )
    if incident.next_auto_at is None:
        return incident.model_copy(update={"next_auto_at": now + policy.backoff * 2**situation.auto_restarts})
    return incident
