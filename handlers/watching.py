"""Watching jobs: the watch cycle (one probe per host), incident posts, ``ack`` and ``watch``.

:class:`Watcher` runs one cycle for the jobs of one host: it reads every job's Redis view in
one pipelined round trip (:class:`~pipeline.state.jobstate.JobStore`: watcher memory, open incident,
pause, lock, newest run, automatic restarts), probes the host once (:func:`pipeline.host.probe.probe_host`), decides each job with
the pure :func:`pipeline.observe.watch.assess`, and applies the transitions — each one a
compare-and-set in Redis *before* its post, so of two processes deciding the same thing only
one posts.  An unreachable host is confirmed over a fresh connection
(:meth:`~pipeline.host.remote.SSHPool.check`) before it is reported, as its own incident.

Posts: the alert is the headline message ``incident:JOB:N`` in the job's channel (mentioning
``[slack] alert_mention``); reminders (every ``remind_every`` s while open and not
acknowledged), kind changes, automatic restarts, the crash-loop give-up and ``resolved after
N min`` go in its thread, and the headline is updated in place; many at once are told as one
story (:mod:`handlers.storm`).  Events: ALERT (``kind`` dead | degraded | stalled | unreachable |
crash_loop), RESOLVED, RESTART (automatic restarts).

Automatic restarts (opt-in, ``[jobs.NAME.watch] auto_restart``) go through the same
:class:`~handlers.dispatch.Dispatcher` as a person's ``restart JOB`` — locked, posted and
audited — as the system principal :data:`AUTO_USER`, injected by the assembly (:class:`Restarts`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from handlers.alerts import (
    acked_reply,
    alert_exit_cause,
    alert_reply,
    auto_restart_reply,
    changed_reply,
    give_up_reply,
)
from handlers.auth import SYSTEM_USER
from handlers.context import Context
from handlers.crashcheck import check_crash, refusal, with_crash
from handlers.hangevidence import KINDS as HANG_KINDS
from handlers.hangevidence import hang_evidence
from handlers.reply import Reply, Status, mention
from handlers.storm import Round, Storyteller, Told
from handlers.watchstats import WatchStats
from pipeline import fmt
from pipeline.config import JobConfig
from pipeline.errors import ExitCode, HostKeyRejected, HostUnreachable, PitstopError
from pipeline.host.contract import EvidenceArgs
from pipeline.host.probe import JobProbe, call_helper, log_tail, recorded_identity
from pipeline.observe import progress
from pipeline.observe.crashes import detect_cause
from pipeline.observe.watch import (
    DEFAULT_REMIND_EVERY,
    Action,
    ActionKind,
    Decision,
    Observation,
    Situation,
    assess,
)
from pipeline.state.events import EventKind
from pipeline.state.incidents import LOG_LINES, Incident, IncidentKind, IncidentStore, WatchState
from pipeline.state.runs import RunRecord
from pipeline.verdict import Verdict

log = logging.getLogger(__name__)

AUTO_USER = SYSTEM_USER  #: the principal automatic restarts are requested (and audited) as
DEFAULT_OFF_S = 24 * 3600  #: ``watch JOB off`` without ``for``: paused this long (s), then on again
AUTO_GRACE = 15.0  #: seconds an automatic restart counts as in flight before its run shows up


class Restarts(Protocol):
    """Requests ``restart JOB`` as :data:`AUTO_USER` and answers as a person would be answered
    (the dispatcher's, injected by the assembly); ``drain`` waits at most ``timeout`` s for them."""

    async def restart(self, job: str, channel: str | None) -> Reply: ...

    async def drain(self, timeout: float) -> None: ...


@dataclass
class JobView:
    """One job's state in Redis at the start of a cycle."""

    name: str
    cfg: JobConfig
    current: dict[str, str]
    state: WatchState
    incident: Incident | None
    paused: bool
    lock_held: bool
    lock_holder: dict[str, str]
    latest: RunRecord | None
    unverified: bool
    auto_restarts: int


class Watcher:
    """Watch cycles and their posts for one Pitstop process.

    :param ctx: the process context (config, Redis, SSH pool, outbox, events).
    :param restarts: requests the automatic restarts (the assembly passes the dispatcher's).
    :param remind_every: seconds between reminders of an open, unacknowledged incident.
    """

    def __init__(
        self, ctx: Context, restarts: Restarts, *, remind_every: float = DEFAULT_REMIND_EVERY
    ) -> None:
        self.ctx = ctx
        self.restarts = restarts
        self.remind_every = remind_every
        self.store = ctx.redis.open_store(IncidentStore)
        self._auto_fired: dict[str, float] = {}
        self._short: dict[str, str | None] = {}  #: job → where its engine last saw the count fall short
        self.teller = Storyteller(
            ctx, self.store
        )  #: rounds of cycles, told as stories (:mod:`handlers.storm`)
        self.stats = WatchStats()  #: probes and cycles measured, for ``/metrics``

    # --- one cycle ---------------------------------------------------------------------------

    async def cycle(
        self, host: str, jobs: Sequence[str] | None = None, *, now: float | None = None
    ) -> dict[str, Decision]:
        """Probe ``host`` once and decide every watched job on it.

        :param host: a configured host name.
        :param jobs: the jobs to watch (default: every job on ``host``).
        :param now: unix s (default: the current time).
        :returns: job name → the decision taken (paused and unprobeable jobs are absent).

        The alerts and resolutions it decides are told when the last cycle of its round ends
        (cycles of other hosts starting with it join it), grouped from ``[slack] group_from``
        (:mod:`handlers.storm`); it returns once they are, or after ``storm.TELL_WAIT`` s.
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
        config = self.ctx.config
        names = list(jobs) if jobs is not None else [n for n, j in config.jobs.items() if j.host == host]
        now = time.time() if now is None else now
        views = [v for v in await self.load(names, now) if not v.paused]
        if not views:
            return {}
        probing = time.monotonic()
        seen = await self.ctx.restarter.sightings([(v.name, v.cfg, v.current or None) for v in views])
        unreachable: str | None = None
        if any(s.probe.error for s in seen.values()):
            unreachable = await self._confirm_unreachable(host)
            if unreachable is None:  # the host answers a fresh connection: look at those jobs again
                again = [v for v in views if (s := seen.get(v.name)) is None or s.probe.error]
                seen = {
                    **seen,
                    **await self.ctx.restarter.sightings([(v.name, v.cfg, v.current or None) for v in again]),
                }
        self.stats.probed(host, time.monotonic() - probing, failed=unreachable is not None)
        decisions: dict[str, Decision] = {}
        steps = await asyncio.gather(
            *(self._progress(v, s.probe if (s := seen.get(v.name)) else None, now) for v in views)
        )
        for view, judged in zip(views, steps, strict=True):
            sight = seen.get(view.name)
            probe = sight.probe if sight else JobProbe(job=view.name, error="no answer")
            self._short[view.name] = sight.detail if sight else None
            if probe.error and unreachable is None:
                log.warning("watch %s: probe failed but %s answers: %s", view.name, host, probe.error)
                continue
            if not probe.error:
                self.stats.seen[view.name] = probe.count
            obs = dataclasses.replace(self._observation(probe, now, unreachable), progress=judged)
            cfg = view.cfg
            if sight is not None and (sight.exit_cause or sight.detail):
                obs = dataclasses.replace(obs, exit_cause=sight.exit_cause, detail=sight.detail)
            if sight is not None and sight.expected != cfg.processes:
                cfg = cfg.model_copy(update={"processes": sight.expected})
            decisions[view.name] = assess(
                view.name,
                cfg,
                obs,
                view.state,
                view.incident,
                self._situation(view, now),
                remind_every=self.remind_every,
            )
        await self.store.save_states({name: d.state for name, d in decisions.items()})
        by_name = {v.name: v for v in views}
        acting = [
            (by_name[n], d) for n, d in decisions.items() if d.actions or d.incident != by_name[n].incident
        ]
        if acting:
            await asyncio.gather(*(self._apply(v, d, now, rnd) for v, d in acting))
        return decisions

    async def load(self, names: Sequence[str], now: float) -> list[JobView]:
        """Every named job's Redis view, in one pipelined round trip (:class:`~pipeline.state.jobstate.JobStore`)."""
        snaps = await self.ctx.jobs.read_many(names, now=now)
        return [
            JobView(
                name=s.name,
                cfg=self.ctx.config.jobs[s.name],
                current=dict(s.current),
                paused=s.paused,
                lock_held=s.lock_held,
                lock_holder=dict(s.lock_holder),
                auto_restarts=s.auto_restarts,
                state=s.watch,
                incident=s.incident,
                latest=s.latest,
                unverified=s.unverified,
            )
            for s in snaps
        ]

    async def _progress(self, view: JobView, probe: JobProbe | None, now: float) -> progress.Judgement | None:
        """The ranks' step progress after reading the metric log's new lines (None when nothing runs
        or the log cannot be read: the log-bytes rule applies then)."""
        if probe is None or probe.error or probe.count == 0:
            return None
        latest = view.latest
        try:
            state = await progress.refresh(
                self.ctx.ssh,
                self.store,
                view.name,
                view.cfg,
                run_pid=latest.pid if latest is not None else None,
                launch_offset=latest.log_size_at_launch if latest is not None else None,
                now=now,
            )
        except PitstopError as exc:
            log.info("watch %s: no step progress: %s", view.name, exc.message)
            return None
        return progress.judge(state, now, progress.rank_stall_threshold(view.cfg, state.gaps))

    async def _confirm_unreachable(self, host: str) -> str | None:
        """None if a fresh connection to ``host`` works, else why it does not."""
        try:
            await self.ctx.ssh.check(host)
        except (HostUnreachable, HostKeyRejected) as exc:
            return exc.message
        return None

    @staticmethod
    def _observation(probe: JobProbe, now: float, unreachable: str | None) -> Observation:
        if probe.error:
            return Observation(at=now, reachable=False, error=unreachable or probe.error)
        return Observation(at=now, count=probe.count, pids=tuple(sorted(probe.pids)), log_size=probe.log_size)

    def _situation(self, view: JobView, now: float) -> Situation:
        latest = view.latest
        in_flight = view.unverified
        if latest is not None and latest.finished_at is None and latest.verdict is None:
            in_flight = True
        if view.lock_held:
            holder_job = view.lock_holder.get("job")
            holder_run = view.lock_holder.get("run_id") or view.lock_holder.get("run")
            if view.cfg.lock_scope == "job" or holder_job is None or holder_job.lower() == view.name.lower():
                in_flight = True
            elif latest is not None and holder_run == latest.id:
                in_flight = True
        fired = self._auto_fired.get(view.name)
        if fired is not None and now - fired < AUTO_GRACE and (latest is None or latest.created_at < fired):
            in_flight = True
        stopped_at = None
        if latest is not None and latest.action == "stop":
            stopped_at = latest.finished_at or latest.created_at
        return Situation(
            in_flight=in_flight,
            stopped_at=stopped_at,
            running_verdict=latest is not None and latest.verdict is Verdict.RUNNING,
            auto_restarts=view.auto_restarts,
            launched_at=latest.launched_at if latest is not None else None,
        )

    # --- applying transitions -----------------------------------------------------------------

    async def _apply(self, view: JobView, decision: Decision, now: float, rnd: Round) -> None:
        try:
            await self._apply_actions(view, decision, now, rnd)
        except PitstopError as exc:
            log.warning("watch %s: %s", view.name, exc.message)
        except Exception:
            log.exception("watch %s: applying %s failed", view.name, [a.kind.value for a in decision.actions])

    async def _apply_actions(self, view: JobView, decision: Decision, now: float, rnd: Round) -> None:
        ctx, name = self.ctx, view.name
        channel = ctx.config.channel_for(name)
        current = view.incident
        for action in decision.actions:
            if action.kind is ActionKind.OPEN:
                inc = await self._with_log(action.incident)
                latest = view.latest
                if latest is not None and latest.action in ("start", "restart"):
                    inc = inc.model_copy(update={"last_actor": latest.requested_by})
                opened = await self.store.open(inc)
                if opened is None:
                    return  # another process opened it: it posts
                current = opened
                rnd.opened.append(Told(opened, channel, now))  # posted when the round is told
                await self._event(EventKind.ALERT, opened)
                rnd.later.append(functools.partial(self._hang_evidence, opened, channel))
            elif action.kind is ActionKind.RESOLVE:
                if current is None or not await self.store.close(current):
                    return
                done = action.incident.model_copy(update={"n": current.n, "rev": current.rev})
                current = None
                rnd.resolved.append(Told(done, channel, now))
                await self._event(EventKind.RESOLVED, done, after_s=round(now - done.opened_at, 3))
            else:
                if current is None:
                    return
                if action.kind is ActionKind.AUTO_RESTART:
                    action = await self._gate(action)
                    if action.kind is ActionKind.GIVE_UP:  # the incident ends as the gate left it
                        decision = dataclasses.replace(decision, incident=action.incident)
                new = action.incident
                if action.kind is ActionKind.CHANGE and new.kind is not IncidentKind.UNREACHABLE:
                    new = await self._with_log(new)
                else:
                    new = new.model_copy(update={"log": current.log, "cause": current.cause})
                new = new.model_copy(update={"last_actor": current.last_actor})  # set when it opened
                updated = await self.store.update(current, new)
                if updated is None:
                    return
                current = updated
                if action.kind is ActionKind.REMIND:
                    rnd.reminded.append(Told(updated, channel, now))  # grouped like alerts
                else:
                    await self._post(action, updated, channel, now)
                if action.kind is ActionKind.CHANGE:
                    await self._hang_evidence(updated, channel)
        if decision.incident is not None and current is not None:
            wanted = decision.incident.model_copy(
                update={"log": current.log, "cause": current.cause, "last_actor": current.last_actor}
            )
            if _differs(wanted, current):
                await self.store.update(current, wanted)

    async def _post(self, action: Action, inc: Incident, channel: str | None, now: float) -> None:
        ctx = self.ctx
        if action.kind is ActionKind.CHANGE:
            assert action.previous is not None
            await ctx.outbox.thread(inc.thread_key, changed_reply(inc, action.previous), channel)
            await ctx.outbox.announce(
                inc.thread_key, alert_reply(inc, ctx.config, now=now, mention=False), channel
            )
            await self._event(EventKind.ALERT, inc, change_from=action.previous.value)
        elif action.kind is ActionKind.GIVE_UP:
            await ctx.outbox.thread(inc.thread_key, give_up_reply(inc, ctx.config), channel)
            await ctx.outbox.announce(
                inc.thread_key, alert_reply(inc, ctx.config, now=now, mention=False), channel
            )
            await self._event(EventKind.ALERT, inc)
        elif action.kind is ActionKind.AUTO_RESTART:
            policy = ctx.config.jobs[inc.job].watch.auto_restart
            await self.store.count_auto_restart(inc, now, policy.within if policy is not None else None)
            self._auto_fired[inc.job] = time.time()
            answer = await self.restarts.restart(inc.job, channel)
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
            await ctx.outbox.thread(inc.thread_key, auto_restart_reply(inc, ctx.config, answer), channel)

    async def _hang_evidence(self, inc: Incident, channel: str | None) -> None:
        """Post the hang evidence (stacks, /proc state) in a stuck-rank or stalled incident's thread."""
        if inc.kind in HANG_KINDS and (reply := await hang_evidence(self.ctx, inc)) is not None:
            await self.ctx.outbox.thread(inc.thread_key, reply, channel)

    async def _gate(self, action: Action) -> Action:
        """An automatic restart about to fire, unless the latest crash is not to be retried: then
        the give-up (no more automatic restarts, and why)."""
        inc = action.incident
        check = await check_crash(self.ctx, inc.job)
        if check is None:
            return action
        why = refusal(inc.job, check, self.ctx.config.jobs[inc.job].watch.auto_restart)
        if why is None:
            return action
        stopped = inc.model_copy(
            update={
                "gave_up": True,
                "no_auto": why,
                "next_auto_at": None,
                "auto_restarts": inc.auto_restarts - 1,
            }
        )
        return Action(ActionKind.GIVE_UP, with_crash(stopped, check))

    async def _with_log(self, inc: Incident) -> Incident:
        """The incident with the job's log tail, the cause found in it and, for a job launched by
        Pitstop, how its process ended (the launch waiter's exit record) — one helper call."""
        if inc.kind is IncidentKind.UNREACHABLE:
            return inc
        name, cfg = inc.job, self.ctx.config.jobs[inc.job]
        exit_cause = inc.exit_cause
        try:
            current = recorded_identity((await self.ctx.jobs.read(name)).current)
            if current["pid"] is not None:
                args: EvidenceArgs = {
                    "name": name,
                    "match": cfg.match,
                    "log": cfg.log,
                    "offset": 0,
                    "tail_lines": LOG_LINES,
                    "pid": current["pid"],
                    "start_time": current["start_time"],
                    "sid": current["sid"],
                }
                answer = await call_helper(self.ctx.ssh, "evidence", args, job=name)
                tail = str(answer.get("tail") or "")
                status = answer.get("status")
                if status and answer.get("state") != "alive":
                    exit_cause = alert_exit_cause(status.get("code"), status.get("signal"))
            else:
                tail = await log_tail(self.ctx.ssh, name, cfg, LOG_LINES)
        except PitstopError as exc:
            log.info("watch %s: no log tail: %s", name, exc.message)
            return inc
        cause = inc.cause if inc.kind is IncidentKind.STUCK_RANK else detect_cause(tail)
        if inc.kind is IncidentKind.DEGRADED and (short := self._short.get(name)):
            cause = short  # where the engine saw the count fall short (a node short of tasks)
        inc = inc.model_copy(update={"log": tail or None, "cause": cause, "exit_cause": exit_cause})
        if inc.kind is IncidentKind.DEAD and (check := await check_crash(self.ctx, name)) is not None:
            inc = with_crash(inc, check)
            why = refusal(name, check, cfg.watch.auto_restart)
            if why is not None:
                inc = inc.model_copy(update={"no_auto": why, "next_auto_at": None})
        return inc

    async def _event(self, kind: EventKind, inc: Incident, **extra: Any) -> None:
        await self.ctx.events.publish(
            kind,
            inc.job,
            alert=inc.kind.value,
            n=inc.n,
            host=inc.host,
            count=inc.count,
            cause=inc.cause,
            instance=self.ctx.instance,
            **extra,
        )

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s each) for automatic restarts and posts still running in the
        background."""
        await self.restarts.drain(timeout)
        await self.teller.drain(timeout)


def _differs(a: Incident, b: Incident) -> bool:
    skip = {"n", "rev"}
    return a.model_dump(exclude=skip) != b.model_dump(exclude=skip)


# --- the verbs: ack, watch ------------------------------------------------------------------------


def _job_or_error(ctx: Context, job: str) -> tuple[str | None, Reply | None]:
    try:
        return ctx.config.job_name(job), None
    except KeyError:
        close = difflib.get_close_matches(job, list(ctx.config.jobs), n=1)
        return None, Reply(
            title=watch_unknown_job(job, close[0] if close else None),
            status=Status.ERROR,
            ephemeral=True,
            exit_code=ExitCode.USAGE,
        )


async def ack_command(ctx: Context, job: str, user: str) -> Reply:
    """``ack JOB``: acknowledge the job's open incident — no more reminders until it resolves.

    Notes who acknowledged in the incident's thread and on its headline.

    :param job: a job name (any case).
    :param user: the requester's id.
    :returns: the answer (INFO when nothing is open or it was already acknowledged).
    """
    name, error = _job_or_error(ctx, job)
    if name is None:
        assert error is not None
        return error
    store = ctx.redis.open_store(IncidentStore)
    for _ in range(5):
        incident = await store.incident(name)
        if incident is None:
            return Reply(title=incident_none_open(name), status=Status.INFO)
        if incident.acked_by:
            return Reply(
                title=incident_already_acked(name, incident.acked_by),
                status=Status.INFO,
                thread_key=incident.thread_key,
            )
        acked = await store.update(
            incident, incident.model_copy(update={"acked_by": user, "acked_at": time.time()})
        )
        if acked is None:
            continue  # changed meanwhile (a reminder, a resolve): read it again
        channel = ctx.config.channel_for(name)
        reply = acked_reply(acked, user)
        await ctx.outbox.thread(acked.thread_key, reply, channel)
        await ctx.outbox.announce(acked.thread_key, alert_reply(acked, ctx.config, mention=False), channel)
        return reply
    return Reply(title=incident_none_open(name), status=Status.INFO)


async def watch_command(ctx: Context, job: str, state: str, for_s: int | None, user: str) -> Reply:
    """``watch JOB on|off [for DURATION]``: pause watching (expires by itself) or resume it.

    ``off`` without a duration pauses for :data:`DEFAULT_OFF_S`.  ``on`` also resets the
    watcher's stall and degradation clocks, so a pause is not mistaken for a stall.

    :param state: ``on`` or ``off``.
    :param for_s: seconds to stay off.
    :param user: the requester's id (recorded as the pause's value).
    :returns: the answer; USAGE error for another state or unknown job.
    """
    name, error = _job_or_error(ctx, job)
    if name is None:
        assert error is not None
        return error
    store = ctx.redis.open_store(IncidentStore)
    if state == "off":
        seconds = int(for_s or DEFAULT_OFF_S)
        await store.pause(name, user, seconds)
        until = fmt.clock(time.time() + seconds, ctx.config.scheduler.timezone)
        return Reply(title=watch_paused(name, until, seconds), status=Status.OK)
    if state == "on":
        return Reply(title=watch_resumed(name, await store.resume(name)), status=Status.OK)
    return Reply(title=watch_bad_state(state), status=Status.ERROR, ephemeral=True, exit_code=ExitCode.USAGE)


# --- text ---------------------------------------------------------------------------------------


def incident_already_acked(job: str, user: str) -> str:
    """``ack JOB`` on an incident someone already acknowledged."""
    return f"the {job} incident was already acknowledged by {mention(user)}"


def incident_none_open(job: str) -> str:
    """``ack JOB`` when nothing is open."""
    return f"no open incident for {job} - nothing to acknowledge"


def watch_paused(job: str, until: str, seconds: float) -> str:
    """Reply of ``watch JOB off [for D]``."""
    return f"watching {job} paused for {fmt.duration(seconds)} (until {until}) - `watch {job} on` resumes it"


def watch_resumed(job: str, was_off: bool) -> str:
    """Reply of ``watch JOB on``."""
    if was_off:
        return f"watching {job} again"
    return f"watching {job} (it was not paused)"


def watch_bad_state(state: str) -> str:
    """``watch JOB`` with something other than on/off."""
    return f"watch takes `on` or `off`, not {state!r}"


def watch_unknown_job(job: str, suggestion: str | None) -> str:
    """A watch/ack command naming a job that is not configured."""
    hint = f" - did you mean {suggestion}?" if suggestion else ""
    return f"no job called {job!r}{hint}"
