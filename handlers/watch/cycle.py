"""Watching jobs: the watch cycle (one probe per host) and the incidents it opens and posts.

:class:`Watcher` runs one cycle per host: every job's Redis view in one round trip, one probe of
the host (processes, log size, new metric bytes, how a job short of processes ended; at most
:data:`MAX_HOSTS_AT_ONCE` at a time), the pure :func:`pipeline.observe.watch.assess` per job, then
its transitions, each a compare-and-set in Redis *before* its post, so of two processes deciding
the same thing only one posts.  An unreachable host is confirmed over a fresh connection before it
is reported.  Alerts are ``incident:JOB:N`` headlines; reminders, changes, automatic restarts and
resolutions go in their thread, many at once told as one story (:mod:`handlers.watch.alerts`).  Events:
ALERT, RESOLVED, RESTART.  Automatic restarts, and the stop of a job whose loss went NaN under
``on_loss_nan = "stop"``, go through a dispatcher of the watcher's own (locked, posted, audited) as
:data:`~handlers.request.auth.SYSTEM_USER`.  A loss incident names the checkpoint to roll back to
(:func:`pipeline.observe.loss.checkpoint_before`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from handlers.context import Context
from handlers.reply import Status
from handlers.request.auth import SYSTEM_SURFACE, SYSTEM_USER
from handlers.request.dispatch import Dispatcher, Request
from handlers.runs.view import run_reply, thread_key
from handlers.text import alert_exit_cause, probe_slow_line, scheduled_restart, timeout_resubmit
from handlers.watch.alerts import (
    Round,
    Storyteller,
    Told,
    about,
    alert_reply,
    auto_restart_reply,
    changed_reply,
    give_up_reply,
    loss_stop_reply,
    pager_alert,
)
from handlers.watch.evidence import check_crash, elsewhere, post_hang_evidence, refusal, with_crash
from handlers.watch.suspects import note_suspects, suspect_nodes
from pipeline.config import AutoRestart, JobConfig
from pipeline.config.jobs import SCHEDULED, CrashClass
from pipeline.engines.base import Entry, Sighting
from pipeline.engines.slurm import resubmits_on_timeout
from pipeline.errors import HostKeyRejected, HostUnreachable, PitstopError
from pipeline.host.probe import JobProbe
from pipeline.observe import progress
from pipeline.observe.attempts import crash_words
from pipeline.observe.crashes import detect_cause
from pipeline.observe.evidence import ended
from pipeline.observe.idle import read_watched
from pipeline.observe.loss import checkpoint_before
from pipeline.observe.watch import (
    DEFAULT_REMIND_EVERY,
    Action,
    ActionKind,
    Decision,
    Observation,
    Situation,
    assess,
    probe_slow,
)
from pipeline.state.events import EventKind
from pipeline.state.incidents import LOG_LINES, Incident, IncidentKind, IncidentStore
from pipeline.state.jobstate import JobSnapshot
from pipeline.verdict import Verdict

log = logging.getLogger(__name__)

AUTO_GRACE = 15.0  #: seconds an automatic restart counts as in flight before its run shows up
MAX_HOSTS_AT_ONCE = 32  #: hosts one process probes at the same time; the others wait for a slot


@dataclasses.dataclass
class HostStats:
    """One host's watching, since this process started."""

    probe_s: float | None = None  #: seconds the last probe took (every job of the host in one call)
    probes: int = 0
    failures: int = 0  #: probes that could not reach the host (confirmed over a fresh connection)
    #: seconds the last watch cycle took, probe, decisions and Redis writes included (not its posts)
    cycle_s: float | None = None
    cycles: int = 0


@dataclasses.dataclass
class WatchStats:
    """What the watcher measured of its own work, for ``/metrics`` (``bot/runtime/metrics.py``): per
    host its probes and watch cycles, per job the processes its last probe saw.  Kept in memory by
    :class:`Watcher`: a replica that does not lead the scheduler reports nothing."""

    hosts: dict[str, HostStats] = dataclasses.field(default_factory=dict)
    seen: dict[str, int] = dataclasses.field(default_factory=dict)  #: job → processes its last probe saw

    def probed(self, host: str, seconds: float, *, failed: bool) -> None:
        """Record one probe of ``host`` that took ``seconds``."""
        stats = self.hosts.setdefault(host, HostStats())
        stats.probe_s = seconds
        stats.probes += 1
        stats.failures += int(failed)

    def cycled(self, host: str, seconds: float) -> None:
        """Record one watch cycle of ``host`` that took ``seconds``."""
        stats = self.hosts.setdefault(host, HostStats())
        stats.cycle_s = seconds
        stats.cycles += 1


class Watcher:
    """Watch cycles and their posts for one Pitstop process.

    :param remind_every: seconds between reminders of an open, unacknowledged incident.
    """

    def __init__(self, ctx: Context, *, remind_every: float = DEFAULT_REMIND_EVERY) -> None:
        self.ctx = ctx
        #: the automatic restarts' own dispatcher: ``restart JOB`` as the system user, audited as a person's
        self.restarts = Dispatcher(ctx)
        self.remind_every = remind_every
        self.store = ctx.redis.open_store(IncidentStore)
        self._auto_fired: dict[str, float] = {}
        self._seen: dict[str, Sighting | None] = {}  #: job → what its engine saw in its last cycle
        #: job → the nodes its automatic restart about to fire leaves out (``restart_elsewhere``)
        self._elsewhere: dict[str, tuple[str, ...]] = {}
        self._probing = asyncio.Semaphore(MAX_HOSTS_AT_ONCE)
        self.teller = Storyteller(ctx, self.store)
        self.stats = WatchStats()  #: probes and cycles measured, for ``/metrics``

    async def cycle(
        self, host: str, jobs: Sequence[str] | None = None, *, now: float | None = None
    ) -> dict[str, Decision]:
        """Probe ``host`` once and decide every watched job on it (default: every job on it).

        :param now: unix s (default: the current time).
        :returns: job name → the decision taken (paused and unprobeable jobs are absent).

        Its posts are told when the last cycle of its round ends (:mod:`handlers.watch.alerts`); it
        returns once they are, or after ``alerts.TELL_WAIT`` s.
        """
        rnd = self.teller.join()
        began = time.monotonic()
        try:
            return await self._cycle(host, jobs, now, rnd)
        finally:
            self.stats.cycled(host, time.monotonic() - began)
            await self.teller.leave(rnd)

    async def _cycle(
        self, host: str, jobs: Sequence[str] | None, now: float | None, rnd: Round
    ) -> dict[str, Decision]:
        cfgs = self.ctx.config.jobs
        names = list(jobs) if jobs is not None else [n for n, j in cfgs.items() if j.host == host]
        now = time.time() if now is None else now
        views = [v for v in await self.ctx.service.jobs.read_many(names, now=now) if not v.paused]
        if not views:
            return {}
        tracked = [
            progress.Tracked(
                v.name,
                cfgs[v.name],
                v.latest.pid if v.latest is not None else None,
                v.latest.log_size_at_launch if v.latest is not None else None,
            )
            for v in views
        ]
        planned = await progress.plan_many(self.store, tracked)
        reads = {name: read for name, (_, read) in planned.items()}

        def entries(of: list[JobSnapshot]) -> list[Entry]:
            return [(v.name, cfgs[v.name], v.current or None) for v in of]

        async with self._probing:  # a slow host holds one slot
            began = time.monotonic()
            seen = await self.ctx.restarter.sightings(entries(views), reads)
            probe_s = round(time.monotonic() - began, 3)
        if any(probe_slow(probe_s, cfgs[v.name]) for v in views):
            log.warning(probe_slow_line(host, probe_s))
        unreachable: str | None = None
        if any(s.probe.error for s in seen.values()):
            try:  # confirmed over a fresh connection before it is reported
                await self.ctx.ssh.check(host)
            except (HostUnreachable, HostKeyRejected) as exc:
                unreachable = exc.message
            if unreachable is None:  # the host answers a fresh connection: look at those jobs again
                again = [v for v in views if (s := seen.get(v.name)) is None or s.probe.error]
                seen = {**seen, **await self.ctx.restarter.sightings(entries(again), reads)}
        self.stats.probed(host, time.monotonic() - began, failed=unreachable is not None)
        decisions: dict[str, Decision] = {}
        probes = {name: s.probe for name, s in seen.items()}
        steps = await progress.judge_many(self.ctx.ssh, self.store, tracked, probes, planned, now)
        gpus = await read_watched(  # one set of nvidia-smi calls for the host
            self.ctx.ssh, host, [(v.name, cfgs[v.name], s.probe) for v in views if (s := seen.get(v.name))]
        )
        for view, judged in zip(views, steps, strict=True):
            sight = seen.get(view.name)
            probe = sight.probe if sight else JobProbe(job=view.name, error="no answer")
            self._seen[view.name] = sight
            if sight is not None and sight.requeued and sight.job_id is not None:
                await self._requeued(view.name, sight)
            if probe.error and unreachable is None:
                log.warning("watch %s: probe failed but %s answers: %s", view.name, host, probe.error)
                continue
            if sight is not None and sight.word == "completing":
                continue  # Slurm is ending it: decided once it has left, by how it ended (NODE_FAIL…)
            if not probe.error:
                self.stats.seen[view.name] = probe.count
            leader = view.latest.pid if view.latest is not None else None
            obs = dataclasses.replace(
                self._observation(probe, now, unreachable, leader),
                progress=judged,
                gpus=gpus.get(view.name),
                probe_s=probe_s,
            )
            cfg = cfgs[view.name]
            if sight is not None and (sight.exit_cause or sight.detail):
                obs = dataclasses.replace(obs, exit_cause=sight.exit_cause, detail=sight.detail)
            if sight is not None and sight.expected != cfg.processes:
                cfg = cfg.model_copy(update={"processes": sight.expected})
            cfg = _resubmitting(cfg, view.incident)
            situation = self._situation(view, now)
            if sight is not None and sight.state == "pending":  # the scheduler holds it: not dead
                situation = dataclasses.replace(situation, in_flight=True, **_queued(view, sight, now))
            decisions[view.name] = assess(
                view.name, cfg, obs, view.watch, view.incident, situation, remind_every=self.remind_every
            )
        await self.store.save_states({name: d.state for name, d in decisions.items()})
        by_name = {v.name: v for v in views}
        acting = [
            (by_name[n], d) for n, d in decisions.items() if d.actions or d.incident != by_name[n].incident
        ]
        if acting:
            await asyncio.gather(*(self._apply(v, d, now, rnd) for v, d in acting))
        return decisions

    @staticmethod
    def _observation(
        probe: JobProbe, now: float, unreachable: str | None, leader: int | None = None
    ) -> Observation:
        """The probe as the rules see it; ``pids`` starts with the launched PID (the session
        leader recorded at launch) while it lives, else the lowest."""
        if probe.error:
            return Observation(at=now, reachable=False, error=unreachable or probe.error)
        pids = sorted(probe.pids)
        if leader is not None and leader in (probe.session_pids or probe.pids):
            pids = [leader, *(p for p in pids if p != leader)]
        return Observation(at=now, count=probe.count, pids=tuple(pids), log_size=probe.log_size)

    def _situation(self, view: JobSnapshot, now: float) -> Situation:
        latest, holder = view.latest, view.lock_holder
        running = latest is not None and latest.finished_at is None and latest.verdict is None
        in_flight = view.unverified or running
        if view.lock_held:
            holder_job = holder.get("job")
            same_job = holder_job is None or holder_job.lower() == view.name.lower()
            same_run = latest is not None and (holder.get("run_id") or holder.get("run")) == latest.id
            job_scope = self.ctx.config.jobs[view.name].lock_scope == "job"
            in_flight = in_flight or job_scope or same_job or same_run
        fired = self._auto_fired.get(view.name)
        if fired is not None and now - fired < AUTO_GRACE and (latest is None or latest.created_at < fired):
            in_flight = True
        stopping = latest is not None and latest.action == "stop"
        return Situation(
            in_flight=in_flight,
            stopped_at=(latest.finished_at or latest.created_at) if latest is not None and stopping else None,
            running_verdict=latest is not None and latest.verdict is Verdict.RUNNING,
            auto_restarts=view.auto_restarts,
            launched_at=latest.launched_at if latest is not None else None,
        )

    async def _apply(self, view: JobSnapshot, decision: Decision, now: float, rnd: Round) -> None:
        try:
            await self._apply_actions(view, decision, now, rnd)
        except PitstopError as exc:
            log.warning("watch %s: %s", view.name, exc.message)
        except Exception:
            log.exception("watch %s: applying %s failed", view.name, [a.kind.value for a in decision.actions])

    async def _apply_actions(self, view: JobSnapshot, decision: Decision, now: float, rnd: Round) -> None:
        ctx, name = self.ctx, view.name
        channel = ctx.config.channel_for(name)
        current = view.incident
        for action in decision.actions:
            if action.kind is ActionKind.OPEN:
                inc = await self._with_rollback(await self._with_log(action.incident))
                latest = view.latest
                if latest is not None and latest.action in ("start", "restart"):
                    inc = inc.model_copy(update={"last_actor": latest.requested_by})
                opened = await self.store.open(inc)
                if opened is None:
                    return  # another process opened it: it posts
                current = opened
                rnd.opened.append(Told(opened, channel, now))  # posted when the round is told
                await self._event(EventKind.ALERT, opened)
                rnd.later.append(functools.partial(post_hang_evidence, self.ctx, opened, channel))
            elif action.kind is ActionKind.RESOLVE:
                if current is None or not await self.store.close(
                    current, at=action.incident.resolved_at or now
                ):
                    return
                if current.paged and ctx.pager is not None:  # its pager's alert resolves too
                    ctx.pager.resolve(pager_alert(current, ctx.config))
                done = action.incident.model_copy(update={"n": current.n, "rev": current.rev})
                current = None
                rnd.resolved.append(Told(done, channel, now))
                await self._event(EventKind.RESOLVED, done, after_s=round(now - done.opened_at, 3))
            elif action.kind is ActionKind.STOP:
                if current is not None:  # after the alert's post: the stop's note goes in its thread
                    rnd.later.append(functools.partial(self._stop, current, channel))
            else:
                if current is None:
                    return
                if action.kind is ActionKind.AUTO_RESTART:
                    action = await self._gate(action)
                    if action.kind is ActionKind.GIVE_UP:  # the incident ends as the gate left it
                        decision = dataclasses.replace(decision, incident=action.incident)
                new = action.incident
                if action.kind is ActionKind.CHANGE and new.kind is not IncidentKind.UNREACHABLE:
                    new = await self._with_rollback(await self._with_log(new))
                else:
                    new = new.model_copy(update={"log": current.log, "cause": current.cause})
                new = new.model_copy(update={"last_actor": current.last_actor})  # set when it opened
                current = await self.store.update(current, new)
                if current is None:
                    return
                if action.kind is ActionKind.REMIND:
                    rnd.reminded.append(Told(current, channel, now))  # grouped like alerts
                else:
                    await self._post(action, current, channel, now)
                if action.kind is ActionKind.CHANGE:
                    await post_hang_evidence(self.ctx, current, channel)
        if decision.incident is not None and current is not None:
            kept = {k: getattr(current, k) for k in _TOLD}
            wanted = decision.incident.model_copy(update={**kept, "last_actor": current.last_actor})
            skip = {"n", "rev"}
            if wanted.model_dump(exclude=skip) != current.model_dump(exclude=skip):
                await self.store.update(current, wanted)

    async def _requeued(self, name: str, sight: Sighting) -> None:
        """Tell a requeue by the scheduler once in the job's channel (whichever process claims it), as
        the headline of a run of its own (:meth:`RunService.requeued
        <pipeline.runs.service.RunService.requeued>`): its verdict follows in its thread."""
        slurm_job, restarts, line = sight.job_id or 0, sight.restarts, sight.requeued or ""
        if not await self.store.claim_requeue(name, slurm_job, restarts):
            return
        run = await self.ctx.service.requeued(name, line, sight.requeue_cause)
        reply = dataclasses.replace(run_reply(run, self.ctx.config), status=Status.WARNING)
        await self.ctx.outbox.announce(thread_key(run.id), reply, self.ctx.config.channel_for(name))
        await self.ctx.events.publish(
            EventKind.REQUEUED,
            name,
            slurm_job=slurm_job,
            restarts=restarts,
            run_id=run.id,
            instance=self.ctx.instance,
        )

    async def _post(self, action: Action, inc: Incident, channel: str | None, now: float) -> None:
        ctx = self.ctx
        if action.kind in (ActionKind.CHANGE, ActionKind.GIVE_UP):
            prev = action.previous
            note = changed_reply(inc, prev) if prev is not None else give_up_reply(inc, ctx.config)
            await about(ctx, inc, channel, note, alert_reply(inc, ctx.config, now=now, mention=False))
            await self._event(EventKind.ALERT, inc, **({"change_from": prev.value} if prev else {}))
        elif action.kind is ActionKind.AUTO_RESTART:
            await about(ctx, inc, channel)  # a member of a story still being told: its line first
            policy = ctx.config.jobs[inc.job].watch.auto_restart
            scheduled = inc.crash_class in SCHEDULED  # a preemption or a time limit: not counted
            if not scheduled:
                await self.store.count_auto_restart(inc, now, policy.within if policy is not None else None)
            self._auto_fired[inc.job] = time.time()
            # the failing rank's node (exit code restart_elsewhere) and the suspect nodes are left out
            left_out = set(self._elsewhere.pop(inc.job, ())) | set(await suspect_nodes(ctx, inc.job, now))
            text = f"restart {inc.job}" + (f" excluding {','.join(sorted(left_out))}" if left_out else "")
            asked = Request(text, SYSTEM_USER, channel=channel, surface=SYSTEM_SURFACE)
            answer = await self.restarts.handle(asked)
            await ctx.events.publish(
                EventKind.RESTART,
                inc.job,
                auto=True,
                attempt=inc.auto_restarts,
                incident=inc.n,
                run_id=answer.run_id,
                answer=answer.title,
                instance=ctx.instance,
            )
            note = auto_restart_reply(inc, ctx.config, answer)
            if scheduled and policy is None:  # only resubmit_on_timeout restarts it
                note = dataclasses.replace(note, title=timeout_resubmit(inc.job, answer.title))
            elif scheduled:
                used, limit = inc.auto_restarts, policy.max if policy is not None else 0
                title = scheduled_restart(inc.job, inc.crash_class or "", used, limit, answer.title)
                note = dataclasses.replace(note, title=title)
            await ctx.outbox.thread(inc.thread_key, note, channel)

    async def _stop(self, inc: Incident, channel: str | None) -> None:
        """``on_loss_nan = "stop"``: stop the job through the run service as the system user (a
        ``stop`` run, locked, recorded, audited and announced), and say so in the incident's thread."""
        asked = Request(f"stop {inc.job}", SYSTEM_USER, channel=channel, surface=SYSTEM_SURFACE)
        answer = await self.restarts.handle(asked)
        await about(self.ctx, inc, channel, loss_stop_reply(inc, answer))

    async def _with_rollback(self, inc: Incident) -> Incident:
        """A loss incident with the checkpoint to roll back to (the newest before its trouble
        began); as it is when the host cannot say (logged)."""
        if inc.kind not in (IncidentKind.LOSS_NAN, IncidentKind.LOSS_SPIKE) or inc.loss_step is None:
            return inc
        try:
            step = await checkpoint_before(
                self.ctx.ssh, inc.job, self.ctx.config.jobs[inc.job], inc.loss_step
            )
        except PitstopError as exc:
            log.info("watch %s: no checkpoint to roll back to: %s", inc.job, exc.message)
            return inc
        return inc.model_copy(update={"rollback_step": step})

    async def _gate(self, action: Action) -> Action:
        """An automatic restart about to fire, unless the latest crash is not to be retried, or the
        last ``no_progress_after`` attempts died without progress (:mod:`pipeline.runs.attempts`): then
        the give-up (no more automatic restarts, and why)."""
        inc, cfg = action.incident, self.ctx.config.jobs[action.incident.job]
        check = await check_crash(self.ctx, inc.job, self._seen.get(inc.job))
        why = refusal(inc.job, check, cfg.watch.auto_restart, cfg.exit_codes) if check else None
        if why is None:
            ended = crash_words(check.crash) if check is not None else None
            why = await self.ctx.service.no_progress_refusal(inc.job, ended)
        if check is not None and check.crash.kind in SCHEDULED:  # not a crash: no attempt spent, no rule
            free = with_crash(inc, check).model_copy(update={"auto_restarts": inc.auto_restarts - 1})
            return Action(ActionKind.AUTO_RESTART, free)
        if why is None:
            self._elsewhere[inc.job] = elsewhere(check, cfg.exit_codes)
            return action
        give_up = {
            "gave_up": True,
            "no_auto": why,
            "next_auto_at": None,
            "auto_restarts": inc.auto_restarts - 1,
        }
        stopped = inc.model_copy(update=give_up)
        return Action(ActionKind.GIVE_UP, with_crash(stopped, check) if check is not None else stopped)

    async def _with_log(self, inc: Incident) -> Incident:
        """The incident with the job's log tail, the cause found in it and, for a job launched by
        Pitstop, how its process ended (the launch waiter's exit record): what the cycle's sighting
        brought of a job short of processes, else the tail asked of its engine."""
        if inc.kind is IncidentKind.UNREACHABLE:
            return inc
        name, cfg = inc.job, self.ctx.config.jobs[inc.job]
        sight = self._seen.get(name)
        probe = sight.probe if sight is not None else None
        exit_cause, tail = inc.exit_cause, probe.tail if probe is not None else None
        if probe is not None and (how := ended(probe.state, probe.exit_status)):
            exit_cause = alert_exit_cause(how.code, how.signal)
        if tail is None:
            try:
                tail = await self.ctx.restarter.on_job(name, lambda e, t: e.log_tail(t, LOG_LINES))
            except PitstopError as exc:
                log.info("watch %s: no log tail: %s", name, exc.message)
                return inc
        # the watcher's own cause line
        kept = inc.kind in (
            IncidentKind.STUCK_RANK,
            IncidentKind.IDLE_GPUS,
            IncidentKind.LOSS_NAN,
            IncidentKind.LOSS_SPIKE,
        )
        cause = inc.cause if kept else detect_cause(tail)
        if inc.kind is IncidentKind.DEGRADED and sight is not None and sight.detail:
            cause = sight.detail  # where the engine saw the count fall short (a node short of tasks)
        inc = inc.model_copy(update={"log": tail or None, "cause": cause, "exit_cause": exit_cause})
        if inc.kind is IncidentKind.DEAD and (check := await check_crash(self.ctx, name, sight)) is not None:
            inc = with_crash(inc, check)
            why = refusal(name, check, cfg.watch.auto_restart, cfg.exit_codes)
            if why is not None:
                inc = inc.model_copy(update={"no_auto": why, "next_auto_at": None})
        return await note_suspects(self.ctx, inc)

    async def _event(self, kind: EventKind, inc: Incident, **extra: Any) -> None:
        about = dict(alert=inc.kind.value, n=inc.n, host=inc.host, count=inc.count, cause=inc.cause)
        await self.ctx.events.publish(kind, inc.job, **about, instance=self.ctx.instance, **extra)

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s each) for automatic restarts and posts still running in the
        background."""
        await self.restarts.drain(timeout)
        await self.teller.told(timeout)


#: the automatic restart a job that reached its time limit gets from ``resubmit_on_timeout`` alone:
#: at the next cycle, for ``time_limit`` only (never counted: :meth:`Watcher._gate`)
_RESUBMIT = AutoRestart(backoff=0.001, on=[CrashClass.TIME_LIMIT])


def _resubmitting(cfg: JobConfig, incident: Incident | None) -> JobConfig:
    """The job's config as the watch rules see it: a job without ``auto_restart`` whose open
    incident is its time limit, under ``[jobs.NAME.slurm] resubmit_on_timeout``, is restarted
    automatically (:data:`_RESUBMIT`); any other as configured."""
    reached = incident is not None and incident.crash_class == CrashClass.TIME_LIMIT.value
    if not reached or cfg.watch.auto_restart is not None or not resubmits_on_timeout(cfg):
        return cfg
    return cfg.model_copy(update={"watch": cfg.watch.model_copy(update={"auto_restart": _RESUBMIT})})


def _queued(view: JobSnapshot, sight: Sighting, now: float) -> dict[str, Any]:
    """A PENDING job the scheduler requeued (its newest run a ``requeue``): how long since (s) and
    why, as :class:`~pipeline.observe.watch.Situation` takes them; nothing for another pending job."""
    latest = view.latest
    if latest is None or latest.action != "requeue" or latest.launched_at is None:
        return {}
    return {"queued_for": now - latest.launched_at, "pending_reason": sight.line}


#: the incident's evidence set when it opened or changed kind (:meth:`Watcher._with_log`): what
#: its alert told stays with it
_TOLD = (
    "log",
    "cause",
    "exit_cause",
    "rollback_step",
    "suspects",
    *(f for f in Incident.model_fields if f.startswith("crash_")),
)
