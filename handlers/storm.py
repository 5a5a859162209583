"""Alert storms told as one story: what one watch round opened and resolved, grouped per channel.

A host that dies takes its jobs with it, and a bad driver crashes dozens at once; into a channel
Slack lets a bot post to about once a second.  The incidents stay one each — opened, acknowledged,
paused and resolved on its own (:mod:`pipeline.state.incidents`) — but they are told together:

- the watcher (:class:`handlers.watching.Watcher`) defers the posts of the incidents it opens and
  resolves into a :class:`Round`; cycles of several hosts that start together (the scheduler's
  ticks of one interval) join one round, and the last of them to end tells it (:func:`tell`,
  through a :class:`Storyteller`, never holding the next cycle back);
- :func:`plan` groups a round per channel (pure): from ``[slack] group_from`` jobs of one host
  unreachable, one **host story** ("host gpu-07 unreachable: 40 jobs cannot be checked: dflash,
  …"); from ``group_from`` other incidents, one **grouped post** with a line per job; from
  ``group_from`` resolutions, one grouped resolution (and reminders alike, :func:`plan_reminders`).  Fewer are told one by one, as before (jobs
  with channels of their own never storm one channel);
- a story is one headline (``story:ID``, paging ``alert_mention`` and every member's owners); each
  member keeps a message of its own, a one-line reply in the story's thread
  (:meth:`~handlers.outbox.Outbox.announce_in`), updated in place when it is acknowledged or
  resolved.  Its incident records the story (``story``), so any process renders it as a member
  (:func:`handlers.alerts.alert_reply`); what is posted about a member before the story reached
  its line (acknowledged, resolved meanwhile) waits for the headline and posts the line first
  (:func:`line_first`), so it goes in the story's thread.

Transport-free: what each post says is built here and in :mod:`handlers.alerts`; how it looks in
Slack is :mod:`bot.blocks`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from handlers.alerts import (
    alert_reply,
    incident_reminder,
    mention_of,
    owners_of,
    reminder_reply,
    resolved_headline,
    resolved_reply,
)
from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.reply import mention as _mention
from pipeline import fmt
from pipeline.config import Config
from pipeline.errors import ExitCode
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore

log = logging.getLogger(__name__)

ROUND_JOIN_S = 1.0  #: seconds after a round began during which another host's cycle joins it
TELL_WAIT = 5.0  #: seconds a cycle waits for its round's posts before it returns (they go on)
NAMES_IN_TITLE = 5  #: job names a host story's title lists before "and N more"


@dataclass(frozen=True)
class Told:
    """One incident opened, resolved or reminded of in a round, to be told.

    :ivar channel: its job's channel (None: the announce channel).
    :ivar at: when the cycle decided it (unix s).
    """

    incident: Incident
    channel: str | None
    at: float


@dataclass
class Round:
    """The posts of one watch round, deferred until its last cycle ends.

    :ivar began: when it began (monotonic s).
    :ivar members: cycles still running in it.
    :ivar opened: incidents it opened; ``resolved``, ``reminded``: those it resolved, reminded of.
    :ivar later: posts that follow an opened incident's headline (hang evidence), in order.
    """

    began: float = field(default_factory=time.monotonic)
    members: int = 0
    opened: list[Told] = field(default_factory=list)
    resolved: list[Told] = field(default_factory=list)
    reminded: list[Told] = field(default_factory=list)
    later: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def joinable(self, now: float) -> bool:
        """True while another cycle may still join (:data:`ROUND_JOIN_S` since it began)."""
        return self.members > 0 and now - self.began <= ROUND_JOIN_S


class Storyteller:
    """The rounds of one watcher: cycles :meth:`join` one, the last to :meth:`leave` tells it.

    The telling runs in a task of its own and a cycle waits for it at most :data:`TELL_WAIT` s,
    so a storm's posts (one per second in a channel) never hold the next watch cycle back.

    :param ctx: the process context (config, outbox).
    :param store: where a story is recorded on its members' incidents.
    """

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
        if self._round is rnd:
            self._round = None
        task = asyncio.get_running_loop().create_task(tell(self.ctx, self.store, rnd))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)
        await asyncio.wait({task}, timeout=TELL_WAIT)

    async def told(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until the round open now, if any, has ended and every round
        begun was told: what a cycle decided is then in the outbox (a script that waits for an
        alert's event shows the alert before its next command)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._round is not None and self._round.members > 0:
                    await asyncio.sleep(0.05)  # its cycles are still probing or deciding
                if self._telling:
                    await asyncio.wait(set(self._telling))

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every round begun was told."""
        if self._telling:
            await asyncio.wait(set(self._telling), timeout=timeout)


@dataclass(frozen=True)
class Story:
    """Incidents of one round told as one post.

    :ivar key: the outbox key of its headline (``story:ID``), or the story its resolved members
        were told in (a grouped resolution goes in that thread).
    :ivar kind: ``host`` (one host unreachable), ``failures``, ``resolved`` or ``reminder``.
    :ivar channel: where its headline goes (None: the announce channel).
    :ivar host: the host of a ``host`` story.
    :ivar thread: a grouped resolution or reminder of one story's members: posted in its thread.
    """

    key: str
    kind: str
    channel: str | None
    members: tuple[Told, ...]
    host: str | None = None
    thread: bool = False


def _new_key() -> str:
    return f"story:{uuid.uuid4().hex[:12]}"


def plan(
    opened: Sequence[Told], resolved: Sequence[Told], *, group_from: int, announce: str | None
) -> tuple[list[Story], list[Told], list[Told]]:
    """Group one round's incidents into stories, per channel (pure).

    In each channel: the unreachable incidents of one host, ``group_from`` or more, are one host
    story; the other opened incidents, ``group_from`` or more, one grouped post; the resolved
    ones, ``group_from`` or more, one grouped resolution (in the thread of the story they were
    told in, when they all were told in one).

    :param group_from: ``[slack] group_from``: incidents from which they are told as one (0: never).
    :param announce: the announce channel (where a job without a channel of its own posts).
    :returns: the stories, then the opened and the resolved incidents told one by one.
    """
    if group_from <= 0:
        return [], list(opened), list(resolved)
    stories: list[Story] = []
    single_open: list[Told] = []
    for channel, told in _by_channel(opened, announce).items():
        by_host: dict[str, list[Told]] = {}
        rest: list[Told] = []
        for t in told:
            if t.incident.kind is IncidentKind.UNREACHABLE:
                by_host.setdefault(t.incident.host, []).append(t)
            else:
                rest.append(t)
        for host, same in by_host.items():
            if len(same) >= group_from:
                stories.append(Story(_new_key(), "host", channel, tuple(same), host=host))
            else:
                rest.extend(same)
        if len(rest) >= group_from:
            stories.append(Story(_new_key(), "failures", channel, tuple(rest)))
        else:
            single_open.extend(rest)
    single_resolved = _follow_ups("resolved", resolved, stories, group_from, announce)
    return stories, single_open, single_resolved


def _follow_ups(
    kind: str, told: Sequence[Told], stories: list[Story], group_from: int, announce: str | None
) -> list[Told]:
    """Group resolutions or reminders per channel into ``stories`` (``group_from`` or more in a
    channel; in the thread of the story they were all told in, if one); returns the rest."""
    alone: list[Told] = []
    for channel, same in _by_channel(told, announce).items():
        if len(same) < group_from:
            alone.extend(same)
            continue
        common = {t.incident.story for t in same}
        told_in = common.pop() if len(common) == 1 else None
        key = told_in or _new_key()
        stories.append(Story(key, kind, channel, tuple(same), thread=told_in is not None))
    return alone


def plan_reminders(
    reminded: Sequence[Told], *, group_from: int, announce: str | None
) -> tuple[list[Story], list[Told]]:
    """Group one round's reminders like its resolutions (pure): ``group_from`` or more in a
    channel are one grouped reminder.

    :returns: the grouped reminders, then the reminders told one by one.
    """
    if group_from <= 0:
        return [], list(reminded)
    stories: list[Story] = []
    alone = _follow_ups("reminder", reminded, stories, group_from, announce)
    return stories, alone


def _by_channel(told: Sequence[Told], announce: str | None) -> dict[str | None, list[Told]]:
    """Incidents by the channel they are told in, each channel's by job name."""
    out: dict[str | None, list[Told]] = {}
    for t in sorted(told, key=lambda t: t.incident.job):
        out.setdefault(t.channel or announce, []).append(t)
    return out


async def tell(ctx: Context, store: IncidentStore, rnd: Round) -> None:
    """Post what ``rnd`` opened and resolved: grouped (:func:`plan`) or one by one, channels in
    parallel, then the posts that follow a headline (:attr:`Round.later`).  Never raises: a post
    that fails is logged (the outbox tells people what Slack refused)."""
    config = ctx.config
    stories, opens, resolves = plan(
        rnd.opened, rnd.resolved, group_from=config.slack.group_from, announce=config.slack.announce_channel
    )
    reminders, reminds = plan_reminders(
        rnd.reminded, group_from=config.slack.group_from, announce=config.slack.announce_channel
    )
    work: list[Awaitable[None]] = [_open_story(ctx, store, s) for s in stories if s.kind != "resolved"]
    work += [_resolve_story(ctx, store, s) for s in stories if s.kind == "resolved"]
    work += [_remind_story(ctx, s) for s in reminders]
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


async def line_first(ctx: Context, incident: Incident, channel: str | None) -> None:
    """Before anything is posted about ``incident`` (an acknowledgement, a resolution, a
    reminder, a change): if it is told in a grouped post, its own line there comes first — posted
    now, after the grouped post's headline, if the story has not reached it yet — so what follows
    goes in the story's thread, in order, never as a message of its own.  Nothing for an incident
    told on its own, or whose line is already posted.

    :param channel: its job's channel (None: the announce channel).
    """
    if incident.story is not None:
        reply = alert_reply(incident, ctx.config, mention=False)
        await ctx.outbox.announce_in(incident.thread_key, reply, incident.story, channel)


async def _open_one(ctx: Context, t: Told) -> None:
    inc = t.incident
    await ctx.outbox.announce(inc.thread_key, alert_reply(inc, ctx.config, now=t.at), t.channel)


async def _resolve_one(ctx: Context, store: IncidentStore, t: Told) -> None:
    inc = t.incident
    await line_first(ctx, inc, t.channel)
    await ctx.outbox.thread(inc.thread_key, resolved_reply(inc, now=t.at), t.channel)
    await ctx.outbox.announce(inc.thread_key, resolved_headline(inc, ctx.config, now=t.at), t.channel)
    if inc.story is not None and not await _still_open(ctx, store, inc.story):
        # the last open job of a grouped post: its headline turns resolved too
        done = Reply(title=story_all_resolved(), status=Status.OK, thread_key=inc.story)
        await ctx.outbox.announce(inc.story, done, t.channel)


async def _remind_one(ctx: Context, t: Told) -> None:
    inc = t.incident
    await line_first(ctx, inc, t.channel)
    await ctx.outbox.thread(inc.thread_key, reminder_reply(inc, ctx.config, now=t.at), t.channel)


async def _remind_story(ctx: Context, story: Story) -> None:
    reply = story_reminder_reply(story, ctx.config, now=story.members[0].at)
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
    by_channel: dict[str | None, list[Told]] = {}
    for t in members:
        by_channel.setdefault(t.channel, []).append(t)

    async def one_channel(told: list[Told]) -> None:
        for t in told:
            await post(t)

    await asyncio.gather(*(one_channel(told) for told in by_channel.values()))


async def _open_story(ctx: Context, store: IncidentStore, story: Story) -> None:
    at = story.members[0].at
    reply = story_reply(story, story.members, ctx.config, now=at)
    # the headline's post starts (its outbox key taken) before the story is recorded on any member,
    # so a member acknowledged meanwhile waits for it (line_first) rather than posting on its own
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
    at = story.members[0].at
    reply = story_resolved_reply(story, now=at)
    if story.thread:
        left = await _still_open(ctx, store, story.key)
        if left:  # the headline stays an alert while any of its jobs is still down
            reply = replace(reply, lines=(*reply.lines, story_still_open(left)))
        await ctx.outbox.thread(story.key, reply, story.channel)
        if not left:
            await ctx.outbox.announce(story.key, reply, story.channel)
    else:
        await ctx.outbox.post(reply, story.channel)

    async def member(t: Told) -> None:
        await line_first(ctx, t.incident, t.channel)
        await ctx.outbox.announce(
            t.incident.thread_key, resolved_headline(t.incident, ctx.config, now=t.at), t.channel
        )

    await _in_channels(story.members, member)


def story_reply(story: Story, members: Sequence[Told], config: Config, *, now: float) -> Reply:
    """The headline of a story: who is paged, then a line per job.

    :param members: the story's members (its headline says the same with ``story`` recorded on
        them or not).
    :returns: an ERROR reply keyed ``story.key``, paging ``alert_mention`` and every member's owners.
    """
    incidents = [t.incident for t in members]
    owners = tuple(dict.fromkeys(o for inc in incidents for o in owners_of(inc, config)))
    who = " ".join(w for w in (mention_of(config), *map(_mention, owners)) if w)
    names = [inc.job for inc in incidents]
    if story.kind == "host":
        assert story.host is not None
        title = story_host_title(story.host, names)
        error = next((inc.error for inc in incidents if inc.error), None)
        lines = [story_paging_line(who or None), *([story_host_error(error)] if error else [])]
        lines += [
            story_host_job(inc.job, inc.count, inc.expected, inc.last_alive_at, now) for inc in incidents
        ]
    else:
        kinds = Counter(inc.kind.value for inc in incidents)
        title = story_failures_title(len(incidents), len({inc.host for inc in incidents}), kinds)
        lines = [story_paging_line(who or None)]
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
    hosts = {inc.host for inc in incidents if inc.kind is IncidentKind.UNREACHABLE}
    longest = max((inc.resolved_at or now) - inc.opened_at for inc in incidents)
    lines = tuple(resolved_reply(inc, now=now).title for inc in incidents)
    every_host = all(inc.kind is IncidentKind.UNREACHABLE for inc in incidents)
    title = story_resolved_title(len(incidents), longest, sorted(hosts) if every_host else [])
    return Reply(title=title, status=Status.OK, lines=lines, thread_key=story.key)


def story_reminder_reply(story: Story, config: Config, *, now: float) -> Reply:
    """One grouped reminder: who is paged again, and a line per job still open and not acknowledged."""
    incidents = [t.incident for t in story.members]
    owners = tuple(dict.fromkeys(o for inc in incidents for o in owners_of(inc, config)))
    who = " ".join(w for w in (mention_of(config), *map(_mention, owners)) if w)
    kinds = Counter(inc.kind.value for inc in incidents)
    title = story_reminder_title(len(incidents), kinds)
    lines = tuple(incident_reminder(inc.job, inc.kind.value, now - inc.opened_at) for inc in incidents)
    return Reply(
        title=f"{who} {title}" if who else title,
        page=config.slack.alert_mention,
        owners=owners,
        status=Status.WARNING,
        lines=lines,
        thread_key=story.key,
    )


# --- text ---------------------------------------------------------------------------------------


def story_reminder_title(count: int, kinds: Counter[str]) -> str:
    """The headline of a grouped reminder: ``still open, not acknowledged: 40 jobs (40 unreachable)``."""
    parts = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in kinds.most_common())
    return f"still open, not acknowledged: {count} jobs ({parts})"


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_IN_TITLE])
    more = len(names) - NAMES_IN_TITLE
    return f"{shown} and {more} more" if more > 0 else shown


def story_host_title(host: str, jobs: Sequence[str]) -> str:
    """The headline of a host story: ``host gpu-07 unreachable: 40 jobs cannot be checked: dflash, …``."""
    return f"host {host} unreachable: {len(jobs)} jobs cannot be checked: {_listed(jobs)}"


def story_host_error(error: str) -> str:
    """Why the host could not be reached."""
    return f"error: {error}"


def story_host_job(job: str, count: int, expected: int, last_alive_at: float | None, now: float) -> str:
    """A host story's line for one of its jobs."""
    seen = f"last seen {fmt.duration(now - last_alive_at)} ago" if last_alive_at is not None else "never seen"
    return f"{job}: {count}/{expected} processes, {seen}"


def story_failures_title(count: int, hosts: int, kinds: Counter[str]) -> str:
    """The headline of a grouped post: ``60 jobs need attention on 6 hosts: 58 down, 2 degraded``."""
    said = {"dead": "down", "stuck_rank": "with a stuck rank", "crash_loop": "crash-looping"}
    parts = ", ".join(f"{n} {said.get(kind, kind)}" for kind, n in kinds.most_common())
    where = f"{hosts} hosts" if hosts != 1 else "1 host"
    return f"{count} jobs need attention on {where}: {parts}"


def story_paging_line(who: str | None) -> str:
    """The first line of a story: who is called, and that each job is handled on its own."""
    lead = f"{who} " if who else ""
    return f"{lead}each job has its own message (in this thread or its channel): `ack JOB` acknowledges one, `watch JOB off for 2h` pauses one"


def story_all_resolved() -> str:
    """A grouped post's headline once the last of its jobs resolved on its own."""
    return "resolved: every job of this alert has recovered (each job's line says when)"


def story_still_open(jobs: Sequence[str]) -> str:
    """The line of a partial grouped resolution: the story's jobs still open (its headline stays)."""
    return f"still open: {len(jobs)} job{'' if len(jobs) == 1 else 's'} ({_listed(jobs)})"


def story_resolved_title(count: int, longest: float, hosts: Sequence[str]) -> str:
    """The headline of a grouped resolution."""
    if hosts:
        return f"resolved: {', '.join(hosts)} reachable again ({count} jobs, after up to {fmt.duration(longest)})"
    return f"resolved: {count} incidents (open up to {fmt.duration(longest)})"
