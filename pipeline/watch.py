"""The watcher's incident state machine: probe results in, incident transitions out.

Each watch cycle turns what one probe saw of a job (:class:`Observation`) plus what Pitstop
knows about it (:class:`Situation`: a restart in flight, a deliberate stop, the last verdict)
into a :class:`Decision`: the job's new :class:`WatchState` and the incident transitions to
make (:class:`Action`): open an incident, change its kind, remind, resolve, restart
automatically, give up on a crash loop.  :func:`assess` is pure (no I/O, time passed in), so
every rule is tested without hosts or clocks.

Incidents and watcher memory live in Redis (:class:`WatchStore`: ``keys.incident``,
``keys.watch_state``), so a restart of Pitstop or a change of scheduler leader neither
forgets an open incident nor alerts it again.  Every incident change is a compare-and-set on
the incident's revision (``rev``): of two processes that decide the same transition, one
applies it and posts; the other's write fails and it posts nothing.

Conditions, in precedence order, for a job with an expected process count ``processes``:

- ``unreachable``: the probe could not reach the host, and a fresh connection failed too, in
  ``unreachable_after`` consecutive cycles spanning at least 2 intervals (fewer: ``probe_failed``,
  no incident); an unreachable host never leads to an automatic restart;
- ``dead``: no process, while the job should be running (a RUNNING verdict, or seen alive,
  and not stopped on purpose since);
- ``degraded``: more than zero but fewer than ``processes`` for ``degraded_after`` s;
- ``stuck_rank``: one rank's step has not advanced for ``rank_stall_after`` s while other ranks
  advanced or wait on it (:mod:`pipeline.progress`); not during ``warmup`` s after a launch;
- ``stalled``: alive, but no rank's step advanced for ``stall_after`` s, not during ``warmup`` s
  after a launch; for a job whose log has no steps: no new log bytes for ``stall_after`` s;
- ``crash_loop``: dead again after ``auto_restart.max`` automatic restarts within ``within``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict

from pipeline import keys
from pipeline.config import JobConfig
from pipeline.crashes import detect_cause
from pipeline.progress import Judgement, stuck_facts

DEFAULT_REMIND_EVERY = 1800.0  #: seconds between reminders of an open, unacknowledged incident
LOG_LINES = 30  #: log lines shown in an alert


class IncidentKind(StrEnum):
    """What is wrong with a job; the values are the ``kind`` of ALERT events."""

    DEAD = "dead"
    DEGRADED = "degraded"
    STALLED = "stalled"
    STUCK_RANK = "stuck_rank"
    UNREACHABLE = "unreachable"
    CRASH_LOOP = "crash_loop"


class ActionKind(StrEnum):
    """An incident transition decided by :func:`assess`."""

    OPEN = "open"  #: a new incident: post the alert
    CHANGE = "change"  #: the open incident became another kind (degraded → dead)
    REMIND = "remind"  #: re-post in the incident's thread (not acknowledged)
    RESOLVE = "resolve"  #: the job is healthy again (or was stopped on purpose)
    AUTO_RESTART = "auto_restart"  #: restart the job through the locked sequence
    GIVE_UP = "give_up"  #: crash loop: no more automatic restarts


@dataclass(frozen=True)
class Observation:
    """What one probe cycle saw of one job.

    :ivar at: when (unix s).
    :ivar reachable: False when the host could not be reached (confirmed over a fresh connection).
    :ivar count: matching processes.
    :ivar pids: their PIDs, the launched (lowest) one first.
    :ivar log_size: bytes in the job's log (and metric log), or None if it could not be read.
    :ivar exit_cause: how the last process ended, when the host knows (``exit 1``, ``SIGKILL``).
    :ivar error: why the host could not be reached.
    :ivar detail: what the engine says beside the count (Slurm: the nodes short of tasks), kept
        as the incident's ``cause``.
    :ivar progress: the ranks' step progress (:func:`pipeline.progress.judge`), None if not read.
    """

    at: float
    reachable: bool = True
    count: int = 0
    pids: tuple[int, ...] = ()
    log_size: int | None = None
    exit_cause: str | None = None
    error: str | None = None
    detail: str | None = None
    progress: Judgement | None = None


@dataclass(frozen=True)
class Situation:
    """What Pitstop knows about a job beyond the probe.

    :ivar in_flight: a restart/start/stop is running or awaiting its verification (lock held,
        or the job's newest run unfinished).
    :ivar stopped_at: when the job was last stopped on purpose (``stop JOB``), if that is its
        newest run; None otherwise.
    :ivar running_verdict: the newest run's verdict is RUNNING.
    :ivar auto_restarts: automatic restarts within ``auto_restart.within`` so far.
    :ivar launched_at: when the job's newest run was launched (for ``watch.warmup``), if known.
    """

    in_flight: bool = False
    stopped_at: float | None = None
    running_verdict: bool = False
    auto_restarts: int = 0
    launched_at: float | None = None


class _Stored(BaseModel):
    """A model kept as a Redis hash of strings (None fields are absent)."""

    model_config = ConfigDict(extra="ignore")

    def to_hash(self) -> dict[str, str]:
        """Field → string, leaving out None (bools as ``1``/``0``)."""
        out: dict[str, str] = {}
        for name, value in self.model_dump(mode="json").items():
            if value is None:
                continue
            if isinstance(value, bool):
                out[name] = "1" if value else "0"
            elif isinstance(value, float):
                out[name] = repr(value)
            else:
                out[name] = str(value)
        return out


class WatchState(_Stored):
    """The watcher's memory of a job between cycles (``keys.watch_state``).

    :ivar last_alive_at: when a process of the job was last seen (unix s).
    :ivar last_pid: the launched PID seen then.
    :ivar last_count: how many processes were seen then.
    :ivar log_size: the log size at the last cycle (bytes).
    :ivar progress_at: when the log last grew (unix s).
    :ivar degraded_since: since when fewer than ``processes`` but more than zero run.
    :ivar exit_cause: the last exit cause the host reported.
    :ivar probe_failures: consecutive cycles the host could not be reached; ``unreachable_since``
        when the first of them was.
    """

    last_alive_at: float | None = None
    last_pid: int | None = None
    last_count: int | None = None
    log_size: int | None = None
    progress_at: float | None = None
    degraded_since: float | None = None
    exit_cause: str | None = None
    probe_failures: int | None = None
    unreachable_since: float | None = None


class Incident(_Stored):
    """A job's open incident (``keys.incident``); deleted when it resolves.

    :ivar n: the job's incident number (thread key ``incident:JOB:N``).
    :ivar rev: revision, bumped by every change (compare-and-set).
    :ivar notified_at: when the alert or the last reminder was posted.
    :ivar next_auto_at: when the next automatic restart is due (unix s), if one is.
    :ivar auto_restarts: automatic restarts made during this incident.
    """

    n: int = 0
    rev: int = 0
    job: str
    host: str
    kind: IncidentKind
    opened_at: float
    changed_at: float | None = None
    notified_at: float
    count: int = 0
    expected: int = 1
    last_pid: int | None = None
    last_alive_at: float | None = None
    exit_cause: str | None = None
    cause: str | None = None
    log: str | None = None  #: the log tail shown in the alert
    error: str | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    next_auto_at: float | None = None
    auto_restarts: int = 0
    gave_up: bool = False
    resolved_at: float | None = None
    resolution: str | None = None  #: why it resolved: running | stopped | reachable
    rank: int | None = None  #: a stuck rank: its global rank, role, last step and pid
    rank_role: str | None = None
    rank_step: int | None = None
    rank_pid: int | None = None
    crash_class: str | None = None  #: a dead job: the class of its failure (pipeline.crashes)
    crash_evidence: str | None = None
    crash_exc_type: str | None = None
    crash_message: str | None = None
    crash_rank: int | None = None
    crash_step: int | None = None
    no_auto: str | None = None  #: why no automatic restart follows (the give-up alert's text)

    @property
    def thread_key(self) -> str:
        """The outbox key of the incident's alert message: ``incident:JOB:N``."""
        return incident_key(self.job, self.n)


def incident_key(job: str, n: int) -> str:
    """The outbox key of a job's ``n``-th incident."""
    return f"incident:{job}:{n}"


@dataclass(frozen=True)
class Action:
    """One incident transition; ``incident`` is the incident as it is after the action."""

    kind: ActionKind
    incident: Incident
    previous: IncidentKind | None = None  #: the kind before a CHANGE


@dataclass(frozen=True)
class Decision:
    """The outcome of one cycle for one job.

    :ivar state: the watcher memory to save.
    :ivar incident: the open incident after the actions (None if none or resolved).
    :ivar actions: the transitions to apply, in order.
    :ivar condition: what the cycle found (``ok``, ``pending``, ``idle``, ``in_flight`` or
        an :class:`IncidentKind` value).
    """

    state: WatchState
    incident: Incident | None
    actions: tuple[Action, ...]
    condition: str


_BAD = {
    IncidentKind.DEAD,
    IncidentKind.DEGRADED,
    IncidentKind.STALLED,
    IncidentKind.STUCK_RANK,
    IncidentKind.UNREACHABLE,
}


def _expected(state: WatchState, situation: Situation) -> bool:
    """Should the job be running: a RUNNING verdict or seen alive, and not stopped on purpose since."""
    if situation.stopped_at is not None and (state.last_alive_at or 0.0) <= situation.stopped_at:
        return False
    return situation.running_verdict or state.last_alive_at is not None


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
    """Decide one watch cycle for one job.

    :param job: the job's configured name.
    :param cfg: its configuration (``processes``, ``watch``).
    :param obs: what the probe saw (``obs.at`` is "now").
    :param state: the watcher memory from the previous cycle.
    :param incident: the job's open incident, if any.
    :param situation: restarts in flight, deliberate stops, verdicts, auto-restart count.
    :param remind_every: seconds between reminders of an unacknowledged open incident.
    :returns: the new state, the incident after the cycle and the transitions to make.
    """
    now = obs.at
    w = cfg.watch
    if not obs.reachable:
        since = state.unreachable_since if state.unreachable_since is not None else now
        fails = (state.probe_failures or 0) + 1
        state = state.model_copy(update={"probe_failures": fails, "unreachable_since": since})
        if fails < w.unreachable_after or now - since < 2 * w.interval:
            return Decision(state, incident, (), "probe_failed")  # one lost probe is no verdict
        if incident is None:
            new = Incident(
                job=job,
                host=cfg.host,
                kind=IncidentKind.UNREACHABLE,
                opened_at=now,
                notified_at=now,
                count=state.last_count or 0,
                expected=cfg.processes,
                last_pid=state.last_pid,
                last_alive_at=state.last_alive_at,
                error=obs.error,
            )
            return Decision(state, new, (Action(ActionKind.OPEN, new),), IncidentKind.UNREACHABLE.value)
        return _remind(state, incident, now, remind_every, IncidentKind.UNREACHABLE.value)

    st = state.model_copy(update={"probe_failures": None, "unreachable_since": None})
    actions: list[Action] = []
    if incident is not None and incident.kind is IncidentKind.UNREACHABLE:
        resolved = incident.model_copy(update={"resolved_at": now, "resolution": "reachable"})
        actions.append(Action(ActionKind.RESOLVE, resolved))
        incident = None

    if obs.count > 0:
        st.last_alive_at = now
        st.last_pid = obs.pids[0] if obs.pids else st.last_pid
        st.last_count = obs.count
    if obs.exit_cause:
        st.exit_cause = obs.exit_cause
    if obs.log_size is not None and obs.log_size != st.log_size:
        st.progress_at = now  # grew, or rotated/truncated: either way the job wrote
        st.log_size = obs.log_size
    if st.progress_at is None or obs.count == 0:
        st.progress_at = now  # no baseline yet, or nothing running to stall
    if obs.count == 0 or obs.count >= cfg.processes:
        st.degraded_since = None
    elif st.degraded_since is None:
        st.degraded_since = now

    if situation.in_flight:
        # a planned restart: no alerts; progress and degradation are measured from its end
        st.progress_at = now
        st.degraded_since = None
        if incident is not None and incident.next_auto_at is not None:
            incident = incident.model_copy(update={"next_auto_at": None})
        return Decision(st, incident, tuple(actions), "in_flight")

    expected = _expected(st, situation)
    warming = situation.launched_at is not None and now - situation.launched_at < w.warmup
    steps = obs.progress if obs.progress is not None and obs.progress.known else None
    condition: IncidentKind | str
    if obs.count == 0:
        condition = IncidentKind.DEAD if expected else "idle"
    elif st.degraded_since is not None and now - st.degraded_since >= w.degraded_after:
        condition = IncidentKind.DEGRADED
    elif not warming and steps is not None and steps.stuck:
        condition = IncidentKind.STUCK_RANK
    elif not warming and steps is not None and (steps.frozen_for or 0.0) >= w.stall_after:
        condition = IncidentKind.STALLED
    elif steps is None and now - (st.progress_at or now) >= w.stall_after:
        condition = IncidentKind.STALLED
    elif obs.count < cfg.processes:
        condition = "pending"
    else:
        condition = "ok"

    facts: dict[str, Any] = {
        "count": obs.count,
        "expected": cfg.processes,
        "last_pid": st.last_pid,
        "last_alive_at": st.last_alive_at,
        "exit_cause": st.exit_cause,
        **({"cause": obs.detail} if obs.detail else {}),
    }
    if condition is IncidentKind.STUCK_RANK and steps is not None:
        facts.update(stuck_facts(steps, cfg.host))
    if incident is None:
        if isinstance(condition, IncidentKind):
            new = Incident(job=job, host=cfg.host, kind=condition, opened_at=now, notified_at=now, **facts)
            new = _plan_auto_restart(new, cfg, situation, now)
            actions.append(Action(ActionKind.OPEN, new))
            return Decision(st, new, tuple(actions), condition.value)
        return Decision(st, None, tuple(actions), str(condition))

    if condition == "ok" or condition == "idle":
        why = "running" if condition == "ok" else "stopped"
        resolved = incident.model_copy(update={"resolved_at": now, "resolution": why, **facts})
        actions.append(Action(ActionKind.RESOLVE, resolved))
        return Decision(st, None, tuple(actions), str(condition))
    if condition == "pending":
        return _remind(st, incident, now, remind_every, "pending", actions)

    assert isinstance(condition, IncidentKind)
    current = incident.kind
    if current is IncidentKind.CRASH_LOOP and condition is IncidentKind.DEAD:
        return _remind(st, incident, now, remind_every, condition.value, actions)
    if condition is not current and condition in _BAD:
        changed = incident.model_copy(update={"kind": condition, "changed_at": now, **facts})
        changed = _plan_auto_restart(changed, cfg, situation, now)
        actions.append(Action(ActionKind.CHANGE, changed, previous=current))
        return Decision(st, changed, tuple(actions), condition.value)

    # the same condition persists: maybe restart automatically, maybe remind
    if condition is IncidentKind.DEAD and cfg.watch.auto_restart is not None and not incident.gave_up:
        if incident.no_auto:  # its crash class is not restarted automatically: say so, once
            incident = incident.model_copy(update={"gave_up": True, "next_auto_at": None, "changed_at": now})
            actions.append(Action(ActionKind.GIVE_UP, incident))
            return Decision(st, incident, tuple(actions), condition.value)
        incident = _plan_auto_restart(incident, cfg, situation, now)
        if incident.gave_up:
            actions.append(Action(ActionKind.GIVE_UP, incident))
            return Decision(st, incident, tuple(actions), IncidentKind.CRASH_LOOP.value)
        if incident.next_auto_at is not None and now >= incident.next_auto_at:
            fired = incident.model_copy(
                update={"next_auto_at": None, "auto_restarts": incident.auto_restarts + 1}
            )
            actions.append(Action(ActionKind.AUTO_RESTART, fired))
            return Decision(st, fired, tuple(actions), condition.value)
    return _remind(st, incident, now, remind_every, condition.value, actions)


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
        delay = policy.backoff * (2**situation.auto_restarts)
        return incident.model_copy(update={"next_auto_at": now + delay})
    return incident


def _remind(
    state: WatchState,
    incident: Incident,
    now: float,
    remind_every: float,
    condition: str,
    actions: list[Action] | None = None,
) -> Decision:
    acts = list(actions or [])
    if incident.acked_by is None and now - incident.notified_at >= remind_every:
        incident = incident.model_copy(update={"notified_at": now})
        acts.append(Action(ActionKind.REMIND, incident))
    return Decision(state, incident, tuple(acts), condition)


# --- Redis storage -------------------------------------------------------------------------------

# KEYS[1] incident hash, KEYS[2] watch state hash; ARGV: field, value, ….  Opens the incident
# only if none is open; numbers it with HINCRBY watch_state.seq.  Returns n, or 0 if one is open.
_OPEN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = redis.call('HINCRBY', KEYS[2], 'incident_seq', 1)
redis.call('HSET', KEYS[1], 'n', n, 'rev', 1, unpack(ARGV))
return n
"""

# KEYS[1] incident hash; ARGV[1] expected n, ARGV[2] expected rev, ARGV[3..]: field, value, ….
# Replaces the whole incident with rev+1 if n and rev match.  Returns the new rev, or 0.
_UPDATE = """
if redis.call('HGET', KEYS[1], 'n') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'rev') ~= ARGV[2] then
  return 0
end
local rev = tonumber(ARGV[2]) + 1
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'n', ARGV[1], 'rev', rev, unpack(ARGV, 3))
return rev
"""

# KEYS[1] incident hash; ARGV[1] expected n, ARGV[2] expected rev.  Deletes it if they match.
_CLOSE = """
if redis.call('HGET', KEYS[1], 'n') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'rev') ~= ARGV[2] then
  return 0
end
return redis.call('DEL', KEYS[1])
"""


def _flat(fields: dict[str, str]) -> list[str]:
    out: list[str] = []
    for k, v in fields.items():
        if k not in ("n", "rev"):
            out += [k, v]
    return out


class WatchStore:
    """Incidents and watcher memory in Redis, changed only by compare-and-set.

    :param client: an asyncio Redis client with ``decode_responses=True``.
    :param prefix: the key prefix (:mod:`pipeline.keys`).
    """

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._open = client.register_script(_OPEN)
        self._update = client.register_script(_UPDATE)
        self._close = client.register_script(_CLOSE)

    async def load(self, job: str) -> tuple[WatchState, Incident | None]:
        """The job's watcher memory and open incident (None if none)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.watch_state(self.prefix, job))
            pipe.hgetall(keys.incident(self.prefix, job))
            raw_state, raw_incident = await pipe.execute()
        state = WatchState.model_validate(raw_state or {})
        incident = Incident.model_validate(raw_incident) if raw_incident else None
        return state, incident

    async def incident(self, job: str) -> Incident | None:
        """The job's open incident, or None."""
        raw = await self.client.hgetall(keys.incident(self.prefix, job))
        return Incident.model_validate(raw) if raw else None

    async def save_state(self, job: str, state: WatchState) -> None:
        """Write the watcher memory (fields that became None are removed)."""
        key = keys.watch_state(self.prefix, job)
        fields = state.to_hash()
        gone = [name for name in WatchState.model_fields if name not in fields]
        async with self.client.pipeline(transaction=True) as pipe:
            if fields:
                pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
            if gone:
                pipe.hdel(key, *gone)
            await pipe.execute()

    async def open(self, incident: Incident) -> Incident | None:
        """Open ``incident`` if the job has none open.

        :returns: the stored incident (numbered, rev 1), or None if one was already open.
        """
        n = await self._open(
            keys=[keys.incident(self.prefix, incident.job), keys.watch_state(self.prefix, incident.job)],
            args=_flat(incident.to_hash()),
        )
        if not n:
            return None
        return incident.model_copy(update={"n": int(n), "rev": 1})

    async def update(self, expected: Incident, new: Incident) -> Incident | None:
        """Replace the open incident ``expected`` (same ``n`` and ``rev``) by ``new``.

        :returns: ``new`` with its revision bumped, or None if the incident changed meanwhile.
        """
        rev = await self._update(
            keys=[keys.incident(self.prefix, expected.job)],
            args=[str(expected.n), str(expected.rev), *_flat(new.to_hash())],
        )
        if not rev:
            return None
        return new.model_copy(update={"n": expected.n, "rev": int(rev)})

    async def close(self, expected: Incident) -> bool:
        """Delete the open incident ``expected`` (same ``n`` and ``rev``).

        :returns: False if it changed or closed meanwhile.
        """
        done = await self._close(
            keys=[keys.incident(self.prefix, expected.job)], args=[str(expected.n), str(expected.rev)]
        )
        return bool(done)

    async def watch_off_left(self, job: str) -> float | None:
        """Seconds left of a ``watch JOB off`` (``inf`` if it has no expiry), or None if watching is on."""
        ttl = int(await self.client.pttl(keys.watch_off(self.prefix, job)))
        if ttl == -2:
            return None
        return float("inf") if ttl < 0 else ttl / 1000.0


def with_updates(incident: Incident, **changes: Any) -> Incident:
    """``incident`` with fields changed (validated copy)."""
    return Incident.model_validate({**incident.model_dump(), **changes})


__all__ = [
    "DEFAULT_REMIND_EVERY",
    "LOG_LINES",
    "Action",
    "ActionKind",
    "Decision",
    "Incident",
    "IncidentKind",
    "Observation",
    "Situation",
    "WatchState",
    "WatchStore",
    "assess",
    "detect_cause",
    "incident_key",
    "with_updates",
]
