"""The watcher's posts: an incident's alert and its updates, and alert storms told as one story.

An incident's alert (the headline ``incident:JOB:N``), its headline updates (resolved,
acknowledged) and its thread notes are built from the stored
:class:`~pipeline.state.incidents.Incident` alone, so any process can rebuild them.

Alert storms: each incident stays one (opened, acknowledged, paused and resolved on its own), but
a round's are told together, per channel: cycles of hosts that start together join one
:class:`Round`, and the last to end tells it (:func:`tell`, through a :class:`Storyteller`, never
holding the next cycle back).  :func:`plan` groups it per channel (pure), from ``[slack]
group_from``: a host's unreachable jobs are one **host story**, other incidents one **grouped
post**, resolutions and reminders one each; fewer are told one by one.  A story is one headline
(``story:ID``, paging ``alert_mention`` and every member's owners); each member keeps a one-line
message of its own in its thread (:meth:`~handlers.outbox.Outbox.announce_in`), recorded on its
incident (``story``) so any process renders it as a member, and what is posted about it later goes
there (:func:`about`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from handlers import text as words
from handlers.context import Context
from handlers.reply import Reply, Status
from pipeline import fmt
from pipeline.config import AutoRestart, Config, EscalationStep
from pipeline.digest.goodput import gpu_count
from pipeline.errors import ExitCode
from pipeline.pager import PagerAlert
from pipeline.state.incidents import LOG_LINES, Incident, IncidentKind, IncidentStore

log = logging.getLogger(__name__)


def job_owners(config: Config, job: str, last_actor: str | None) -> tuple[str, ...]:
    """Who owns ``job``: ``[jobs.NAME] owners``, plus with ``notify_last_actor`` ``last_actor``
    (the user who last started or restarted it, if a user id)."""
    spec = config.jobs.get(job)
    if spec is None:
        return ()
    actor = last_actor if spec.notify_last_actor else None
    extra = [actor] if actor and actor.startswith(("U", "W")) else []
    return tuple(dict.fromkeys([*spec.owners, *extra]))


def paged(config: Config, incidents: Iterable[Incident]) -> tuple[tuple[str, ...], str]:
    """The owners of the incidents' jobs (:func:`job_owners`, with the actor recorded when each
    opened), and the mentions that page ``alert_mention`` and them ("" for nobody)."""
    owners = tuple(dict.fromkeys(o for i in incidents for o in job_owners(config, i.job, i.last_actor)))
    page = config.slack.alert_mention
    return owners, " ".join(w for w in (page and words.mention(page), *map(words.mention, owners)) if w)


def page_by_dm(config: Config, key: str) -> list[str]:
    """Who gets an alert (key ``incident:JOB:N``) by DM when no channel takes it: its job's owners,
    then the admins (user and user-group ids, without ``"*"``)."""
    job = key.removeprefix("incident:").rpartition(":")[0]
    owners = config.jobs[job].owners if job in config.jobs else []
    return [who for who in dict.fromkeys([*owners, *config.auth.admins]) if who != "*"]


def next_step(incident: Incident, config: Config) -> tuple[float, EscalationStep] | None:
    """The next escalation step of an open incident and when it is due (unix s), or None: its job
    has no policy, it was acknowledged, or every step was taken."""
    policy = config.escalation_for(incident.job) if incident.job in config.jobs else None
    if policy is None or incident.acked_by is not None or incident.escalated >= len(policy.steps):
        return None
    step = policy.steps[incident.escalated]
    return incident.opened_at + step.after, step


def next_step_line(incident: Incident, config: Config, now: float) -> str | None:
    """ "escalates to … at 17:46 (in 20 min) unless acknowledged", or None when nothing follows."""
    due = next_step(incident, config)
    if due is None:
        return None
    return words.escalation_next(due[1].notify, due[0], now, config.scheduler.timezone)


def _fields(incident: Incident, config: Config, now: float) -> tuple[tuple[str, str], ...]:
    """The alert's fields, those without a value left out."""
    tz, seen, auto = config.scheduler.timezone, incident.last_alive_at, incident.auto_restarts
    values = {
        "job": incident.job,
        "host": incident.host,
        "processes": f"{incident.count}/{incident.expected}",
        "last_pid": str(incident.last_pid) if incident.last_pid is not None else "",
        "last_alive": f"{fmt.clock(seen, tz)} ({fmt.duration(now - seen)} ago)"
        if seen is not None
        else words.ALERT_NEVER_SEEN,
        "exit": incident.exit_cause or "",
        "error": incident.error or "",
        "opened": fmt.clock(incident.opened_at, tz),
        "auto": str(auto) if auto else "",
        "acked": words.mention(incident.acked_by) if incident.acked_by else "",
    }
    return tuple((words.ALERT_FIELD_LABELS[key], value) for key, value in values.items() if value)


def _title(i: Incident, config: Config, now: float) -> str:
    """The headline of a new alert, by incident kind (:data:`~handlers.text.ALERT_TITLES`)."""
    quiet = config.jobs[i.job].watch.stall_after + (now - i.opened_at) if i.job in config.jobs else None
    idle = f" for {fmt.duration(quiet)}" if quiet is not None else ""
    said = words.ALERT_TITLES.get(i.kind, "{job}: {kind} on {host}")
    procs, kind = f"{i.count}/{i.expected}", i.kind.value
    loss = dict(loss=i.loss_value, rank=i.rank, step=i.loss_step)
    return said.format(job=i.job, host=i.host, procs=procs, expected=i.expected, idle=idle, kind=kind, **loss)


#: alerts shown as errors (critical for the pager), the others as warnings
_SEVERE = (IncidentKind.DEAD, IncidentKind.CRASH_LOOP, IncidentKind.LOSS_NAN)
_LOSS = (IncidentKind.LOSS_NAN, IncidentKind.LOSS_SPIKE)


def alert_reply(
    incident: Incident, config: Config, *, now: float | None = None, mention: bool = True
) -> Reply:
    """The headline of an open incident: what, where, since when, the cause and the log tail.

    :param now: unix s (default: the current time), for "N min ago".
    :param mention: include ``alert_mention`` (the first post); headline updates leave it out.
    :returns: a WARNING reply (ERROR for dead and crash loops) keyed ``incident:JOB:N``.
    """
    now = time.time() if now is None else now
    job, policy = incident.job, _policy(incident, config)
    fields = _fields(incident, config, now)
    lines = [words.alert_detected_cause(incident.cause)] if incident.cause else []
    lines += [incident.suspects] if incident.suspects else []
    if incident.story is not None:  # told in a grouped post, whose headline pages and says how to ack
        acked = words.ALERT_FIELD_LABELS["acked"]
        fields, log, mention = tuple((k, v) for k, v in fields if k == acked), None, False
    else:
        log = incident.log
        lines.insert(0, f"`ack {job}` to acknowledge, `watch {job} off for 2h` to pause watching")
        if incident.kind is IncidentKind.CRASH_LOOP:
            lines.append(words.crash_loop_gave_up(incident, policy))
        if incident.kind in _LOSS:
            lines.append(words.loss_rollback(job, incident.rollback_step, incident.loss_step))
        if incident.next_auto_at is not None:  # an automatic restart will follow
            delay, limit = fmt.duration(incident.next_auto_at - now), policy.max if policy else 0
            lines.append(f"automatic restart {incident.auto_restarts + 1}/{limit} of {job} in {delay}")
        if log is None and incident.kind is not IncidentKind.UNREACHABLE:
            lines.append(words.ALERT_NO_LOG)
        if escalation := next_step_line(incident, config, now):
            lines.append(escalation)
    owners, who = paged(config, [incident]) if mention else ((), "")
    if who:
        lines[0] = f"{who} {lines[0]}"
    log_path = config.jobs[job].log if job in config.jobs else ""
    return Reply(
        title=_title(incident, config, now),
        page=config.slack.alert_mention if mention else None,
        owners=owners,
        status=Status.ERROR if incident.kind in _SEVERE else Status.WARNING,
        lines=tuple(lines),
        fields=fields,
        log=log or None,
        log_title=f"last {LOG_LINES} lines of {log_path}" if log else "",
        thread_key=incident.thread_key,
        exit_code=ExitCode.FAILED,
    )


def pager_alert(incident: Incident, config: Config) -> PagerAlert:
    """The incident as the pager sees it: keyed by its id (``incident:JOB:N``), critical for dead
    jobs and crash loops, its headline as the summary."""
    severity = "critical" if incident.kind in _SEVERE else "warning"
    summary = _title(incident, config, incident.opened_at)
    return PagerAlert(
        incident.thread_key,
        incident.job,
        incident.kind.value,
        severity,
        summary,
        incident.host,
        incident.opened_at,
    )


def _policy(incident: Incident, config: Config) -> AutoRestart | None:
    return config.jobs[incident.job].watch.auto_restart if incident.job in config.jobs else None


def _open_for(incident: Incident, now: float) -> float:
    """Seconds from the incident's opening to its resolution (or to ``now``)."""
    return (incident.resolved_at if incident.resolved_at is not None else now) - incident.opened_at


def resolved_headline(incident: Incident, config: Config, *, now: float) -> Reply:
    """The alert's headline updated in place once the incident resolved."""
    was = words.ALERT_WAS.get(incident.kind.value, f"was {incident.kind.value.replace('_', ' ')}")
    return Reply(
        title=f"resolved: {incident.job} {was} for {fmt.duration(_open_for(incident, now))}",
        status=Status.OK,
        lines=(words.incident_resolved(incident, _open_for(incident, now), _gpus(incident, config)),),
        fields=_fields(incident, config, now) if incident.story is None else (),
        thread_key=incident.thread_key,
    )


def _gpus(incident: Incident, config: Config) -> int | None:
    """The incident's job's GPU count (:func:`~pipeline.digest.goodput.gpu_count`), None if unknown."""
    return gpu_count(config.jobs[incident.job]) if incident.job in config.jobs else None


def resolved_reply(incident: Incident, *, now: float, gpus: int | None = None) -> Reply:
    """The thread note ``resolved after N min`` (with its cost in GPU-hours given the job's ``gpus``)."""
    text = words.incident_resolved(incident, _open_for(incident, now), gpus)
    return Reply(title=text, status=Status.OK, thread_key=incident.thread_key)


def reminder_reply(incident: Incident, config: Config, *, now: float) -> Reply:
    """The thread re-post of an open, unacknowledged incident (mentions ``alert_mention`` and the
    job's owners)."""
    text = words.incident_reminder(incident.job, incident.kind.value, now - incident.opened_at)
    return paging_reminder(config, [incident], text, incident.thread_key)


def paging_reminder(
    config: Config, incidents: Sequence[Incident], text: str, key: str, lines: tuple[str, ...] = ()
) -> Reply:
    """A reminder in the thread ``key``: ``text`` paging ``alert_mention`` and the incidents' owners again."""
    owners, who = paged(config, incidents)
    title = f"{who} {text}" if who else text
    return Reply(title, Status.WARNING, lines, page=config.slack.alert_mention, owners=owners, thread_key=key)


def changed_reply(incident: Incident, previous: IncidentKind) -> Reply:
    """The thread note when the open incident became another kind."""
    new, old = incident.kind.value.replace("_", " "), previous.value.replace("_", " ")
    return Reply(
        title=f"{incident.job} is now {new} (was {old}): {incident.count}/{incident.expected} processes",
        status=Status.WARNING,
        lines=(words.alert_detected_cause(incident.cause),) if incident.cause else (),
        log=incident.log or None,
        thread_key=incident.thread_key,
    )


def loss_stop_reply(incident: Incident, answer: Reply) -> Reply:
    """The thread note when a NaN loss stops the job (``on_loss_nan = "stop"``), with the dispatcher's answer."""
    return Reply(
        title=words.loss_stopping(incident.job, incident.loss_value, answer.title),
        status=Status.WARNING,
        lines=(words.loss_rollback(incident.job, incident.rollback_step, incident.loss_step),),
        thread_key=incident.thread_key,
        run_id=answer.run_id,
    )


def acked_reply(incident: Incident, user: str) -> Reply:
    """The thread note and the requester's answer for ``ack JOB``."""
    text = f"acknowledged by {words.mention(user)} - no more reminders for {incident.job} until it resolves"
    return Reply(title=text, status=Status.OK, thread_key=incident.thread_key)


def give_up_reply(incident: Incident, config: Config) -> Reply:
    """The single crash-loop alert, in the incident's thread (mentions ``alert_mention``)."""
    text = incident.no_auto or words.crash_loop_gave_up(incident, _policy(incident, config))
    if incident.no_auto is None and incident.cause:
        text += f" ({words.alert_detected_cause(incident.cause)})"
    return replace(
        paging_reminder(config, [], text, incident.thread_key), status=Status.ERROR, exit_code=ExitCode.FAILED
    )


def auto_restart_reply(incident: Incident, config: Config, answer: Reply) -> Reply:
    """The thread note when an automatic restart was requested, with the dispatcher's answer."""
    policy = _policy(incident, config)
    attempt = f"{incident.auto_restarts}/{policy.max if policy else 0}"
    return Reply(
        title=f"automatic restart {attempt} of {incident.job}: {answer.title}",
        status=Status.INFO,
        thread_key=incident.thread_key,
        run_id=answer.run_id,
    )


# --- alert storms: a round's incidents told as one story ---------------------------------------

ROUND_JOIN_S = 1.0  #: seconds after a round began during which another host's cycle joins it
TELL_WAIT = 5.0  #: seconds a cycle waits for its round's posts before it returns (they go on)
NAMES_IN_TITLE = 5  #: job names a host story's title lists before "and N more"


@dataclass(frozen=True)
class Told:
    """One incident opened, resolved or reminded of in a round, to be told."""

    incident: Incident
    channel: str | None  #: its job's channel (None: the announce channel)
    at: float  #: when the cycle decided it (unix s)


@dataclass
class Round:
    """The posts of one watch round, deferred until its last cycle ends."""

    began: float = field(default_factory=time.monotonic)  #: monotonic s
    members: int = 0  #: cycles still running in it
    opened: list[Told] = field(default_factory=list)
    resolved: list[Told] = field(default_factory=list)
    reminded: list[Told] = field(default_factory=list)
    #: posts that follow an opened incident's headline (hang evidence), in order
    later: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  #: set when its last cycle left

    def joinable(self, now: float) -> bool:
        """True while another cycle may still join (:data:`ROUND_JOIN_S` since it began)."""
        return self.members > 0 and now - self.began <= ROUND_JOIN_S


class Storyteller:
    """The rounds of one watcher: cycles :meth:`join` one, the last to :meth:`leave` tells it, in a
    task of its own that a cycle waits for at most :data:`TELL_WAIT` s (a storm's posts, one per
    second in a channel, never hold the next watch cycle back)."""

    def __init__(self, ctx: Context, store: IncidentStore) -> None:
        self.ctx = ctx
        self.store = store
        self._round: Round | None = None
        self._telling: set[asyncio.Task[None]] = set()

    def join(self) -> Round:
        """The round a cycle starting now belongs to (a new one when none is joinable)."""
        rnd = self._round
        if rnd is None or not rnd.joinable(time.monotonic()):
            rnd = self._round = Round()
        rnd.members += 1
        return rnd

    async def leave(self, rnd: Round) -> None:
        """A cycle of ``rnd`` ended; the last one starts the telling and waits for it (bounded)."""
        rnd.members -= 1
        if rnd.members > 0:
            return
        rnd.ended.set()
        if self._round is rnd:
            self._round = None
        task = asyncio.get_running_loop().create_task(tell(self.ctx, self.store, rnd))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)
        await asyncio.wait({task}, timeout=TELL_WAIT)

    async def told(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until the round open now, if any, has ended and every round
        begun was told: what a cycle decided is then in the outbox (a script that waits for an
        alert's event shows the alert before its next command; a watcher that stops drains its posts)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while (rnd := self._round) is not None and rnd.members > 0:
                    await rnd.ended.wait()  # its cycles are still probing or deciding
                if self._telling:
                    await asyncio.wait(set(self._telling))


@dataclass(frozen=True)
class Story:
    """Incidents of one round told as one post."""

    #: the outbox key of its headline (``story:ID``), or the story its members were told in
    key: str
    kind: str  #: ``host`` (one host unreachable), ``failures``, ``resolved`` or ``reminder``
    channel: str | None  #: where its headline goes (None: the announce channel)
    members: tuple[Told, ...]
    host: str | None = None  #: the host of a ``host`` story
    thread: bool = False  #: a grouped resolution or reminder posted in the thread of ``key``


def _new_key() -> str:
    return f"story:{uuid.uuid4().hex[:12]}"


def plan(
    opened: Sequence[Told], resolved: Sequence[Told], *, group_from: int, announce: str | None
) -> tuple[list[Story], list[Told], list[Told]]:
    """Group one round's incidents into stories, per channel (pure).

    In each channel, ``group_from`` or more of each are one story: the unreachable incidents of one
    host (a host story), the other opened incidents (a grouped post), the resolved ones (a grouped
    resolution, in the thread of the story they were all told in, if one).

    :param group_from: ``[slack] group_from`` (0: never group).
    :param announce: the announce channel (where a job without a channel of its own posts).
    :returns: the stories, then the opened and the resolved incidents told one by one.
    """
    if group_from <= 0:
        return [], list(opened), list(resolved)
    stories: list[Story] = []
    single_open: list[Told] = []
    for channel, told in _by_channel(opened, announce).items():
        by_host: dict[str | None, list[Told]] = {None: []}  # None: the incidents of no host story
        for t in told:
            unreachable = t.incident.kind is IncidentKind.UNREACHABLE
            by_host.setdefault(t.incident.host if unreachable else None, []).append(t)
        rest = by_host.pop(None)
        for host, same in by_host.items():
            if len(same) >= group_from:
                stories.append(Story(_new_key(), "host", channel, tuple(same), host=host))
            else:
                rest.extend(same)
        if len(rest) >= group_from:
            stories.append(Story(_new_key(), "failures", channel, tuple(rest)))
        else:
            single_open.extend(rest)
    grouped, single_resolved = plan_follow_ups("resolved", resolved, group_from=group_from, announce=announce)
    return stories + grouped, single_open, single_resolved


def plan_follow_ups(
    kind: str, told: Sequence[Told], *, group_from: int, announce: str | None
) -> tuple[list[Story], list[Told]]:
    """Group one round's resolutions or reminders (``kind``) per channel (pure): ``group_from`` or
    more of a channel are one story, in the thread of the story they were all told in, if one.

    :returns: the grouped ones, then those told one by one.
    """
    if group_from <= 0:
        return [], list(told)
    stories: list[Story] = []
    alone: list[Told] = []
    for channel, same in _by_channel(told, announce).items():
        if len(same) < group_from:
            alone.extend(same)
            continue
        common = {t.incident.story for t in same}
        told_in = common.pop() if len(common) == 1 else None
        stories.append(Story(told_in or _new_key(), kind, channel, tuple(same), thread=told_in is not None))
    return stories, alone


def _by_channel(told: Sequence[Told], announce: str | None) -> dict[str | None, list[Told]]:
    """Incidents by the channel they are told in, each channel's by job name."""
    out: dict[str | None, list[Told]] = {}
    for t in sorted(told, key=lambda t: t.incident.job):
        out.setdefault(t.channel or announce, []).append(t)
    return out


async def tell(ctx: Context, store: IncidentStore, rnd: Round) -> None:
    """Post what ``rnd`` opened, resolved and reminded of: grouped (:func:`plan`) or one by one,
    channels in parallel, then :attr:`Round.later`.  Never raises: a post that fails is logged."""
    group_from, announce = ctx.config.slack.group_from, ctx.config.slack.announce_channel
    stories, opens, resolves = plan(rnd.opened, rnd.resolved, group_from=group_from, announce=announce)
    reminders, reminds = plan_follow_ups("reminder", rnd.reminded, group_from=group_from, announce=announce)
    work: list[Awaitable[None]] = [_open_story(ctx, store, s) for s in stories if s.kind != "resolved"]
    work += [_resolve_story(ctx, store, s) for s in stories if s.kind == "resolved"]
    work += [_follow_up(ctx, s, story_reminder_reply(s, ctx.config, now=s.members[0].at)) for s in reminders]
    work += [_open_one(ctx, t) for t in opens]
    work += [_resolve_one(ctx, store, t) for t in resolves]
    work += [_remind_one(ctx, t) for t in reminds]
    for outcome in await asyncio.gather(*work, return_exceptions=True):
        if isinstance(outcome, BaseException):
            log.error("telling a watch round failed", exc_info=outcome)
    for then in rnd.later:
        try:
            await then()
        except Exception:
            log.exception("a post after an alert failed")


async def about(
    ctx: Context, inc: Incident, channel: str | None, note: Reply | None = None, head: Reply | None = None
) -> None:
    """Post about ``inc`` (an acknowledgement, a resolution, a reminder, a change): if it is told in
    a grouped post, its own line there comes first (posted now if the story has not reached it
    yet), so what follows goes in the story's thread, in order; then ``note`` in its thread and its
    headline updated to ``head``.

    :param channel: its job's channel (None: the announce channel).
    """
    key = inc.thread_key
    if inc.story is not None:
        await ctx.outbox.announce_in(key, alert_reply(inc, ctx.config, mention=False), inc.story, channel)
    if note is not None:
        await ctx.outbox.thread(key, note, channel)
    if head is not None:
        await ctx.outbox.announce(key, head, channel)


async def _open_one(ctx: Context, t: Told) -> None:
    inc = t.incident
    await ctx.outbox.announce(inc.thread_key, alert_reply(inc, ctx.config, now=t.at), t.channel)


async def _resolve_one(ctx: Context, store: IncidentStore, t: Told) -> None:
    inc = t.incident
    await about(
        ctx,
        inc,
        t.channel,
        resolved_reply(inc, now=t.at, gpus=_gpus(inc, ctx.config)),
        resolved_headline(inc, ctx.config, now=t.at),
    )
    if inc.story is not None and not await _still_open(ctx, store, inc.story):
        # the last open job of a grouped post: its headline turns resolved too
        done = Reply(title=words.STORY_ALL_RESOLVED, status=Status.OK, thread_key=inc.story)
        await ctx.outbox.announce(inc.story, done, t.channel)


async def _remind_one(ctx: Context, t: Told) -> None:
    await about(ctx, t.incident, t.channel, reminder_reply(t.incident, ctx.config, now=t.at))


async def _follow_up(ctx: Context, story: Story, reply: Reply) -> None:
    """A grouped resolution or reminder: in the thread of the story its members were told in, else a post."""
    if story.thread:
        await ctx.outbox.thread(story.key, reply, story.channel)
    else:
        await ctx.outbox.post(reply, story.channel)


async def _join(store: IncidentStore, t: Told, key: str) -> Told:
    """The member with its story recorded on the incident (compare-and-set; as it was if the
    incident changed meanwhile)."""
    inc = t.incident.model_copy(update={"story": key})
    try:
        stored = await store.update(t.incident, inc)
    except Exception as exc:  # the story still gets told; the member renders as one alert later
        log.warning("could not record story %s on %s: %s", key, t.incident.thread_key, exc)
        stored = None
    return Told(stored or inc, t.channel, t.at)


async def _in_channels(members: Sequence[Told], post: Callable[[Told], Awaitable[None]]) -> None:
    """``post`` every member, in order within one channel, channels in parallel."""

    async def one_channel(channel: str | None) -> None:
        for t in members:
            if t.channel == channel:
                await post(t)

    await asyncio.gather(*(one_channel(c) for c in dict.fromkeys(t.channel for t in members)))


async def _open_story(ctx: Context, store: IncidentStore, story: Story) -> None:
    reply = story_reply(story, story.members, ctx.config, now=story.members[0].at)
    # the headline's post starts (its outbox key taken) before the story is recorded on any member,
    # so a member acknowledged meanwhile waits for it (:func:`about`) rather than posting on its own
    headline = asyncio.ensure_future(ctx.outbox.announce(story.key, reply, story.channel))
    members = await asyncio.gather(*(_join(store, t, story.key) for t in story.members))
    await headline

    async def member(t: Told) -> None:
        reply = alert_reply(t.incident, ctx.config, now=t.at, mention=False)
        await ctx.outbox.announce_in(t.incident.thread_key, reply, story.key, t.channel)

    await _in_channels(members, member)


async def _still_open(ctx: Context, store: IncidentStore, story: str) -> list[str]:
    """The jobs whose open incident was told in the grouped post ``story``."""
    names = sorted(ctx.config.jobs)
    found = await asyncio.gather(*(store.incident(name) for name in names))
    return [name for name, inc in zip(names, found, strict=True) if inc is not None and inc.story == story]


async def _resolve_story(ctx: Context, store: IncidentStore, story: Story) -> None:
    reply = story_resolved_reply(story, now=story.members[0].at)
    left = await _still_open(ctx, store, story.key) if story.thread else []
    if left:  # the headline stays an alert while any of its jobs is still down
        more = f"still open: {len(left)} job{'' if len(left) == 1 else 's'} ({_listed(left)})"
        reply = replace(reply, lines=(*reply.lines, more))
    await _follow_up(ctx, story, reply)
    if story.thread and not left:
        await ctx.outbox.announce(story.key, reply, story.channel)

    async def member(t: Told) -> None:
        await about(ctx, t.incident, t.channel, head=resolved_headline(t.incident, ctx.config, now=t.at))

    await _in_channels(story.members, member)


def story_reply(story: Story, members: Sequence[Told], config: Config, *, now: float) -> Reply:
    """The headline of a story: who is paged, then a line per job.

    :param members: the story's members (with ``story`` recorded on them or not: the same words).
    :returns: an ERROR reply keyed ``story.key``, paging ``alert_mention`` and every member's owners.
    """
    incidents = [t.incident for t in members]
    owners, who = paged(config, incidents)
    lead = f"{who} " if who else ""
    lines = [
        f"{lead}each job has its own message (in this thread or its channel): "
        "`ack JOB` acknowledges one, `watch JOB off for 2h` pauses one"
    ]
    if story.kind == "host":
        names = [inc.job for inc in incidents]
        title = f"host {story.host} unreachable: {len(names)} jobs cannot be checked: {_listed(names)}"
        if error := next((inc.error for inc in incidents if inc.error), None):
            lines.append(f"error: {error}")
        for inc in incidents:
            seen = inc.last_alive_at
            ago = f"last seen {fmt.duration(now - seen)} ago" if seen is not None else "never seen"
            lines.append(f"{inc.job}: {inc.count}/{inc.expected} processes, {ago}")
    else:  # 60 jobs need attention on 6 hosts: 58 down, 2 degraded
        said = {
            "dead": "down",
            "stuck_rank": "with a stuck rank",
            "crash_loop": "crash-looping",
            "loss_nan": "with a NaN loss",
            "loss_spike": "with a loss spike",
        }
        parts = ", ".join(f"{n} {said.get(kind, kind)}" for kind, n in _kinds(incidents).most_common())
        hosts = len({inc.host for inc in incidents})
        where = f"{hosts} hosts" if hosts != 1 else "1 host"
        title = f"{len(incidents)} jobs need attention on {where}: {parts}"
        lines += [alert_reply(inc, config, now=now, mention=False).title for inc in incidents]
    return Reply(
        title=title,
        page=config.slack.alert_mention,
        owners=owners,
        status=Status.ERROR,
        lines=tuple(lines),
        thread_key=story.key,
        exit_code=ExitCode.FAILED,
    )


def story_resolved_reply(story: Story, *, now: float) -> Reply:
    """One grouped resolution: how many resolved, and a line per job (its own "resolved after")."""
    incidents = [t.incident for t in story.members]
    longest = max((inc.resolved_at or now) - inc.opened_at for inc in incidents)
    lines = tuple(resolved_reply(inc, now=now).title for inc in incidents)
    if all(inc.kind is IncidentKind.UNREACHABLE for inc in incidents):
        after = f"{len(incidents)} jobs, after up to {fmt.duration(longest)}"
        title = f"resolved: {', '.join(sorted({inc.host for inc in incidents}))} reachable again ({after})"
    else:
        title = f"resolved: {len(incidents)} incidents (open up to {fmt.duration(longest)})"
    return Reply(title=title, status=Status.OK, lines=lines, thread_key=story.key)


def story_reminder_reply(story: Story, config: Config, *, now: float) -> Reply:
    """One grouped reminder: who is paged again, and a line per job still open and not acknowledged."""
    incidents = [t.incident for t in story.members]
    parts = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in _kinds(incidents).most_common())
    title = f"still open, not acknowledged: {len(incidents)} jobs ({parts})"
    lines = tuple(words.incident_reminder(inc.job, inc.kind.value, now - inc.opened_at) for inc in incidents)
    return paging_reminder(config, incidents, title, story.key, lines)


def _kinds(incidents: Sequence[Incident]) -> Counter[str]:
    return Counter(inc.kind.value for inc in incidents)


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_IN_TITLE])
    more = len(names) - NAMES_IN_TITLE
    return f"{shown} and {more} more" if more > 0 else shown
