"""Issue 23: alert storms told as one story, against the strict Slack stand-in with its rate limits
on (chat.postMessage about 1/s per channel with a burst of 4, chat.update Tier 3) and Pitstop's
default ``[slack] pace`` of 1 s: a host with 40 jobs gone → one host alert and 40 thread lines, each
job acknowledged on its own, one grouped resolution when it returns; 60 jobs crashing in one round
across 6 hosts → one grouped post per channel, every incident in Slack within the README's bound,
no 429, nothing lost or doubled; 200 jobs on 8 hosts with Slack answering 429 → every incident in
Slack once, each 429 waited out; a job acknowledged or resolved while its grouped post is still on
its way → its line, then its note, in the story's thread, also when it is acknowledged on another
replica (which waits while the grouped post's claim is live, and posts the job on its own once a dead
replica's lease lapsed).  Real SSH hosts, real processes, real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bot.runtime.assembly import build_context, close_context
from bot.slack.api import Delivery, web_client
from bot.slack.outbox import SlackOutbox
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.reply import Status
from handlers.watch.acks import ack_command
from handlers.watch.alerts import Round, Told, plan, plan_follow_ups, tell
from handlers.watch.cycle import Watcher
from pipeline.config import AuthSettings, Config, HostConfig, JobConfig, SlackSettings, WatchSettings
from pipeline.state.deliveries import Posts, UndeliveredAlerts
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore
from pipeline.state.redisconn import RedisHandle
from tests.fixtures.slack import BOT_TOKEN, Channel, FakeSlack
from tests.fixtures.ssh import InProcessHost, start_in_process
from tests.support_handlers import wait_until

PACE = 1.0  #: ``[slack] pace``'s default
ANNOUNCE = "C0ANNOUNCE"
T0 = 1_800_000_000.0


# --- the grouping itself (pure) -------------------------------------------------------------------


def _told(job: str, kind: IncidentKind, host: str = "gpu1", channel: str | None = "C0TEAM") -> Told:
    inc = Incident(n=1, job=job, host=host, kind=kind, opened_at=T0, notified_at=T0)
    return Told(inc, channel, T0)


def test_plan_groups_per_channel_and_per_host_and_leaves_few_alone() -> None:
    """From group_from incidents in one channel they are one story; a host's unreachable jobs are their own story; fewer, or spread over channels, are told one by one."""
    down = [_told(f"j{i}", IncidentKind.DEAD, host=f"gpu{i % 2}") for i in range(4)]
    gone = [_told(f"u{i}", IncidentKind.UNREACHABLE, host="gpu7") for i in range(3)]
    alone = [_told("solo", IncidentKind.DEAD, channel="C0OTHER")]
    stories, opens, resolves = plan([*down, *gone, *alone], [], group_from=3, announce=ANNOUNCE)
    assert sorted((s.kind, s.channel, len(s.members)) for s in stories) == [
        ("failures", "C0TEAM", 4),
        ("host", "C0TEAM", 3),
    ]
    assert [t.incident.job for t in opens] == ["solo"] and resolves == []
    assert all(s.key.startswith("story:") for s in stories)
    # two unreachable jobs of a host are fewer than group_from: they join the channel's other failures
    stories, opens, _ = plan([*down, *gone[:2]], [], group_from=3, announce=ANNOUNCE)
    assert [(s.kind, len(s.members)) for s in stories] == [("failures", 6)] and opens == []
    # off, or too few
    assert plan(down, down, group_from=0, announce=ANNOUNCE)[0] == []
    assert plan(down[:2], down[:2], group_from=3, announce=ANNOUNCE)[0] == []


def test_plan_tells_a_grouped_resolution_in_its_story_s_thread() -> None:
    """Resolutions of members of one story are told in that story's thread; mixed ones get a post of their own."""
    members = [
        Told(t.incident.model_copy(update={"story": "story:abc"}), t.channel, t.at)
        for t in (_told(f"j{i}", IncidentKind.UNREACHABLE) for i in range(3))
    ]
    (story,), _, resolves = plan([], members, group_from=3, announce=ANNOUNCE)
    assert (story.kind, story.key, story.thread, resolves) == ("resolved", "story:abc", True, [])
    mixed = [*members[:2], _told("other", IncidentKind.DEAD)]
    (story,), _, _ = plan([], mixed, group_from=3, announce=ANNOUNCE)
    assert story.thread is False and story.key != "story:abc"


async def test_a_partial_grouped_resolution_keeps_the_alert_headline(redis_handle: RedisHandle) -> None:
    """3 of a story's 6 jobs resolve in one round: the resolution goes in its thread naming the 3 still
    open, and the red headline stays; when the last of them resolves on its own, the headline turns
    resolved."""
    names = [f"j{i}" for i in range(6)]
    job = JobConfig(host="gpu1", workdir="/w", launch=["x"], log="/w/l", match="x", channel="C0TEAM")
    config = Config(
        slack=SlackSettings(group_from=3, announce_channel=ANNOUNCE),
        hosts={"gpu1": HostConfig(address="127.0.0.1")},
        jobs={n: job for n in names},
    )
    store = redis_handle.open_store(IncidentStore)
    outbox = MemoryOutbox()
    ctx = Context.__new__(Context)  # the two parts tell() reads; no hosts, no scheduler
    ctx.config, ctx.outbox = config, outbox
    opened = {}
    for n in names:
        inc = Incident(
            job=n, host="gpu1", kind=IncidentKind.DEAD, opened_at=T0, notified_at=T0, story="story:s1"
        )
        stored = await store.open(inc)
        assert stored is not None
        opened[n] = stored

    async def resolve(which: list[str]) -> None:
        rnd = Round()
        for n in which:
            assert await store.close(opened[n])
            done = opened[n].model_copy(update={"resolved_at": T0 + 60, "resolution": "running again"})
            rnd.resolved.append(Told(done, "C0TEAM", T0 + 60))
        await tell(ctx, store, rnd)

    await resolve(names[:3])
    headline = [p for p in outbox.of("announce") if p.key == "story:s1"]
    (note,) = [p for p in outbox.of("thread") if p.key == "story:s1"]
    assert headline == [] and "still open: 3 jobs (j3, j4, j5)" in note.reply.lines
    await resolve(names[3:5])  # fewer than group_from: one by one, and j5 is still down
    assert [p for p in outbox.of("announce") if p.key == "story:s1"] == []
    await resolve(names[5:])
    (last,) = [p for p in outbox.of("announce") if p.key == "story:s1"]
    assert last.reply.status is Status.OK and last.reply.title.startswith("resolved: every job")


def test_reminders_of_one_round_are_grouped_like_alerts() -> None:
    """group_from reminders in one channel are one grouped reminder, in their story's thread when they share one."""
    members = [
        Told(t.incident.model_copy(update={"story": "story:abc"}), t.channel, t.at)
        for t in (_told(f"j{i}", IncidentKind.DEAD) for i in range(4))
    ]
    (story,), alone = plan_follow_ups("reminder", members, group_from=3, announce=ANNOUNCE)
    assert (story.kind, story.key, story.thread, len(story.members), alone) == (
        "reminder",
        "story:abc",
        True,
        4,
        [],
    )
    assert plan_follow_ups("reminder", members[:2], group_from=3, announce=ANNOUNCE) == ([], members[:2])


# --- end to end -----------------------------------------------------------------------------------


class Gate:
    """A TCP forwarder in front of a host: :meth:`cut` takes the host off the network (every
    connection dropped, nothing listening), :meth:`open` brings it back on the same port."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        """Listen (on the port it had before, if any)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Stop listening and drop every connection."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._conns):
            writer.transport.abort()
        self._conns.clear()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self._conns |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._conns -= {writer, up_writer}


class Jobs:
    """Real processes standing for training jobs: one ``sleep`` per job, named for its ``match``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.token = uuid.uuid4().hex[:10]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def match(self, job: str) -> str:
        """The job's process name (its ``match``)."""
        return f"storm-{self.token}-{job}-job"

    def start(self, job: str) -> None:
        """Start the job's process (in its workdir: a job's processes are those running there)."""
        argv = ["bash", "-c", f"exec -a {self.match(job)} sleep 3600"]
        self.procs[job] = subprocess.Popen(argv, cwd=self.workdir)

    def kill(self, job: str) -> None:
        """SIGKILL the job's process and reap it."""
        proc = self.procs.pop(job)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def cleanup(self) -> None:
        """Kill every job still running."""
        for job in list(self.procs):
            self.kill(job)


def _job(root: Path, jobs: Jobs, name: str, host: str, channel: str) -> JobConfig:
    log = root / f"{name}.log"
    log.write_text("")
    return JobConfig(
        host=host,
        workdir=str(root),
        launch=["sleep", "3600"],
        log=str(log),
        match=jobs.match(name),
        processes=1,
        watch=WatchSettings(interval=1, stall_after=3600, degraded_after=3600),  # type: ignore[arg-type]
        channel=channel,
    )


@contextlib.asynccontextmanager
async def _pitstop(
    fake: FakeSlack,
    redis_config: Config,
    hosts: dict[str, HostConfig],
    jobs: dict[str, JobConfig],
    instance: str = "storm",
) -> AsyncIterator[tuple[Context, SlackOutbox]]:
    """A Pitstop process (replica ``instance``) posting to the Slack stand-in through its real outbox at the default pace."""
    config = redis_config.model_copy(
        update={
            "hosts": hosts,
            "jobs": jobs,
            "slack": SlackSettings(announce_channel=ANNOUNCE, alert_mention="S0ONCALL", pace=PACE),
            "auth": AuthSettings(operators=["*"], viewers=["*"]),
        }
    )
    outbox = SlackOutbox(
        web_client(BOT_TOKEN, base_url=fake.api_url),
        Delivery(default_channel=ANNOUNCE, pace=PACE, settle=0.0, instance=instance),
    )
    ctx = await build_context(config, outbox, instance=instance)
    outbox.bind(ctx.redis.open_store(Posts), ctx.runs, ctx.redis.open_store(UndeliveredAlerts))
    try:
        yield ctx, outbox
    finally:
        await close_context(ctx)


def _top(fake: FakeSlack, channel: str) -> list[dict[str, Any]]:
    return [m for m in fake.posted_to(channel) if not m.get("thread_ts")]


async def _rate_limited(fake: FakeSlack) -> list[str]:
    return [c.method for c in await fake.calls() if c.status == 429]


async def _round_at(watcher: Watcher, hosts: dict[str, HostConfig], now: float) -> set[str]:
    """One watch round: every host's cycle at once, as the scheduler's ticks start them; the conditions decided."""
    decided = await asyncio.gather(*(watcher.cycle(h, now=now) for h in hosts))
    return {d.condition for one in decided for d in one.values()}


@contextlib.asynccontextmanager
async def _storm(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config, teams: list[str], hosts: int, per_host: int
) -> AsyncIterator[tuple[dict[str, str], Jobs, Watcher, dict[str, HostConfig], SlackOutbox]]:
    """``hosts`` in-process hosts with ``per_host`` running jobs each (``h{i}-j{k:02d}``, told in
    ``teams`` in turn), watched by Pitstop after one all-ok round: yields the job → host names,
    the jobs, the watcher, the host configs and the outbox."""
    for team in teams:
        fake_slack.add_channel(Channel(team))
    started: list[InProcessHost] = []
    jobs = Jobs(tmp_path)
    try:
        for i in range(hosts):
            started.append(await start_in_process(tmp_path / f"gpu{i}", real_python=True))
        names = {f"h{i}-j{k:02d}": f"gpu{i}" for i in range(hosts) for k in range(per_host)}
        cfgs = {
            n: _job(tmp_path, jobs, n, h, teams[i % len(teams)]) for i, (n, h) in enumerate(names.items())
        }
        host_cfgs = {f"gpu{i}": h.host_config(connect_timeout=5) for i, h in enumerate(started)}
        for n in names:
            jobs.start(n)
        async with _pitstop(fake_slack, redis_config, host_cfgs, cfgs) as (ctx, outbox):
            watcher = Watcher(ctx)
            assert await _round_at(watcher, host_cfgs, T0) == {"ok"}
            yield names, jobs, watcher, host_cfgs, outbox
    finally:
        jobs.cleanup()
        for h in started:
            await h.host.close()


async def test_a_host_gone_with_40_jobs_is_one_host_alert_40_thread_lines_and_one_resolution(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config
) -> None:
    """A host with 40 jobs cut off: one host alert listing them and one line per job in its thread, within the README's bound and with no 429; one job acknowledged on its own; one grouped resolution when the host is back."""
    team = "C0TEAM"
    host = await start_in_process(tmp_path / "gpu07")
    gate = Gate(host.host.port)
    await gate.open()
    pinned = tmp_path / "known_hosts"
    pinned.write_text(host.host.known_hosts.read_text().replace(f":{host.host.port} ", f":{gate.port} "))
    jobs = Jobs(tmp_path)
    names = [f"job-{i:02d}" for i in range(40)]
    cfgs = {n: _job(tmp_path, jobs, n, "gpu07", team) for n in names}
    hosts = {"gpu07": host.host_config(port=gate.port, known_hosts=pinned, connect_timeout=3)}
    try:
        for n in names:
            jobs.start(n)
        async with _pitstop(fake_slack, redis_config, hosts, cfgs) as (ctx, outbox):
            watcher = Watcher(ctx, remind_every=1.0)
            seen = await watcher.cycle("gpu07", now=T0)
            assert {d.condition for d in seen.values()} == {"ok"} and len(seen) == 40
            await gate.cut()
            began = time.monotonic()
            conditions = [
                {d.condition for d in (await watcher.cycle("gpu07", now=T0 + k * 1.5)).values()}
                for k in (1, 2, 3)
            ]
            await watcher.teller.told(120)  # a cycle waits for its story at most storm.TELL_WAIT s
            took = time.monotonic() - began
            assert conditions == [{"probe_failed"}, {"probe_failed"}, {"unreachable"}]
            (alert,) = _top(fake_slack, team)
            assert str(alert["text"]).startswith(
                "host gpu07 unreachable: 40 jobs cannot be checked: job-00, job-01, job-02, job-03, job-04 and 35 more"
            )
            lines = fake_slack.thread(team, str(alert["ts"]))
            assert sorted(str(m["text"]) for m in lines) == sorted(
                f"host gpu07 unreachable - cannot check {n}" for n in names
            )
            assert took < 40 * PACE + 15  # README: the story at once, then its lines at pace
            assert await _rate_limited(fake_slack) == [] and outbox.failures == []
            # still unreachable at the next reminder: the 40 reminders are one post in the story's thread
            posts_before = len(await fake_slack.calls("chat.postMessage", ok=True))
            await watcher.cycle("gpu07", now=T0 + 6)
            await watcher.teller.told(120)
            reminded = (await fake_slack.calls("chat.postMessage", ok=True))[posts_before:]
            assert len(reminded) == 1 and reminded[0].args["thread_ts"] == alert["ts"]
            assert "still open, not acknowledged: 40 jobs (40 unreachable)" in str(reminded[0].args["text"])
            # one job acknowledged on its own: its own line changes, the others stay as they were
            reply = await ack_command(ctx, "job-07", "U0ACK")
            assert reply.title.startswith("acknowledged by <@U0ACK>")
            where = await outbox.where("incident:job-07:1")
            assert where is not None and where[0] == team
            line = fake_slack.message(team, where[1])
            assert line["updates"] == 1 and "acknowledged by" in str(line["blocks"])
            noted = str(fake_slack.thread(team, str(alert["ts"]))[-1]["text"])
            assert noted.startswith("acknowledged by") and "job-07" in noted
            # the host comes back: one grouped resolution, each job's line updated in place
            posts_before = len(await fake_slack.calls("chat.postMessage", ok=True))
            await gate.open()
            back = await watcher.cycle("gpu07", now=T0 + 6.5)
            await watcher.teller.told(120)
            assert {d.condition for d in back.values()} == {"ok"}
            new_posts = (await fake_slack.calls("chat.postMessage", ok=True))[posts_before:]
            assert len(new_posts) == 1 and new_posts[0].args["thread_ts"] == alert["ts"]
            assert str(new_posts[0].args["text"]).startswith("resolved: gpu07 reachable again (40 jobs")
            assert str(fake_slack.message(team, str(alert["ts"]))["text"]).startswith("resolved: gpu07")
            for n in names:
                loc = await outbox.where(f"incident:{n}:1")
                assert loc is not None
                assert str(fake_slack.message(team, loc[1])["text"]).startswith(
                    f"resolved: {n} was unreachable"
                )
            assert len(_top(fake_slack, team)) == 1
            assert await _rate_limited(fake_slack) == [] and outbox.failures == []
    finally:
        jobs.cleanup()
        with contextlib.suppress(Exception):
            await gate.cut()
        await host.host.close()


async def test_60_jobs_crashing_across_6_hosts_reach_slack_grouped_and_complete(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config
) -> None:
    """60 jobs on 6 hosts killed at once: each of the 3 team channels gets one grouped post listing its 20 jobs and one line per job in its thread, every incident within the README's bound, no 429, none lost or doubled."""
    teams = ["C0TEAMA", "C0TEAMB", "C0TEAMC"]
    async with _storm(fake_slack, tmp_path, redis_config, teams, 6, 10) as (
        names,
        jobs,
        watcher,
        hosts,
        outbox,
    ):
        for n in names:
            jobs.kill(n)
        began = time.monotonic()
        assert await _round_at(watcher, hosts, T0 + 2) == {"dead"}
        await watcher.teller.told(120)
        took = time.monotonic() - began
        told: list[str] = []
        for team in teams:
            (post,) = _top(fake_slack, team)
            assert str(post["text"]).startswith("20 jobs need attention on 6 hosts: 20 down")
            lines = [str(m["text"]) for m in fake_slack.thread(team, str(post["ts"]))]
            assert len(lines) == 20
            told += lines
        assert sorted(told) == sorted(
            f"{n} is down: no processes left on {h} (expected 1)" for n, h in names.items()
        )
        assert took < 20 * PACE + 20  # README: per channel, the story at once, its lines at pace
        calls = await fake_slack.calls("chat.postMessage")
        assert len(calls) == 63 and all(c.ok for c in calls)  # none refused, none lost, none twice
        assert outbox.failures == []
        assert await _rate_limited(fake_slack) == []


async def test_200_incidents_in_one_round_reach_slack_completely_each_429_waited_out(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config
) -> None:
    """200 jobs on 8 hosts killed at once, told in 10 channels with Slack answering 429 three times: every incident reaches Slack, once, in its channel's grouped post and thread; each 429 is waited out for its Retry-After."""
    teams = [f"C0STORM{k}" for k in range(10)]
    async with _storm(fake_slack, tmp_path, redis_config, teams, 8, 25) as (
        names,
        jobs,
        watcher,
        hosts,
        outbox,
    ):
        for n in names:
            jobs.kill(n)
        for _ in range(3):
            fake_slack.rate_limit_next("chat.postMessage", retry_after=1)
        assert await _round_at(watcher, hosts, T0 + 2) == {"dead"}
        await watcher.teller.told(300)  # a hang bound only: at pace, 20 lines a channel take about 20 s
        told: list[str] = []
        for team in teams:
            (post,) = _top(fake_slack, team)
            assert str(post["text"]).startswith("20 jobs need attention on 8 hosts: 20 down")
            told += [str(m["text"]) for m in fake_slack.thread(team, str(post["ts"]))]
        assert sorted(told) == sorted(
            f"{n} is down: no processes left on {h} (expected 1)" for n, h in names.items()
        )  # every incident, none twice
        calls = await fake_slack.calls("chat.postMessage")
        assert [c.status for c in calls].count(429) == 3 and outbox.failures == []
        assert len([c for c in calls if c.ok]) == 10 + 200  # none lost, none posted twice
        for i, c in enumerate(calls):
            if c.status == 429:  # its channel's next call came after Retry-After (1 s), not before
                after = next(d for d in calls[i + 1 :] if d.args["channel"] == c.args["channel"])
                assert after.at - c.at >= 1.0


async def test_a_member_acknowledged_or_resolved_before_its_line_is_posted_lands_in_the_story_s_thread(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config
) -> None:
    """Slack stalled on the grouped post (its ts unknown): one job acknowledged and one resolved meanwhile get their line, then their note, in the story's thread, in order; no top-level message but the story's, none lost or doubled."""
    team = "C0TEAM"
    jobs = Jobs(tmp_path)
    names = [f"job-{i}" for i in range(4)]
    cfgs = {n: _job(tmp_path, jobs, n, "gpu1", team) for n in names}
    hosts = {"gpu1": HostConfig(address="127.0.0.1")}  # never reached: the incidents are opened here
    async with _pitstop(fake_slack, redis_config, hosts, cfgs) as (ctx, outbox):
        store = ctx.redis.open_store(IncidentStore)
        rnd = await _opened_dead(store, names, team)
        fake_slack.hold("chat.postMessage")
        telling = asyncio.create_task(tell(ctx, store, rnd))
        await fake_slack.wait_held("chat.postMessage")  # the grouped post: in flight, its ts unknown
        acking = asyncio.create_task(ack_command(ctx, "job-1", "U0ACK"))
        resolved = await _member_of_story(store, "job-2")
        assert await store.close(resolved)
        back = Round()
        done = resolved.model_copy(update={"resolved_at": T0 + 30, "resolution": "running"})
        back.resolved.append(Told(done, team, T0 + 30))
        resolving = asyncio.create_task(tell(ctx, store, back))

        async def both_waiting() -> bool:  # in the outbox, or at Slack (held)
            depth = int(outbox.queue()["channels"].get(team, {}).get("depth", 0))
            return depth + fake_slack.holding.get("chat.postMessage", 0) >= 3

        await wait_until(both_waiting, timeout=60)
        fake_slack.release()
        await asyncio.wait_for(asyncio.gather(telling, acking, resolving), 120)
        top = _top(fake_slack, team)
        assert len(top) == 1, [m["text"] for m in top]  # the story only: no note, no line on its own
        story = top[0]
        assert str(story["text"]).startswith("4 jobs need attention on 1 host: 4 down")
        calls = await fake_slack.calls("chat.postMessage")
        assert all(c.ok for c in calls) and calls[0].args.get("thread_ts") is None
        assert {c.args.get("thread_ts") for c in calls[1:]} == {story["ts"]}
        posted = [str(c.args["text"]) for c in calls[1:]]
        lines = [f"{n} is down: no processes left on gpu1 (expected 1)" for n in names]
        acked = [i for i, t in enumerate(posted) if t.startswith("acknowledged by") and "job-1" in t]
        back_note = [i for i, t in enumerate(posted) if t.startswith("resolved after 30 s: job-2")]
        assert sorted(posted) == sorted(
            [*lines, posted[acked[0]], posted[back_note[0]]]
        )  # none lost, none twice
        assert posted.index(lines[1]) < acked[0] and posted.index(lines[2]) < back_note[0]
        for n, state in (("job-1", "acknowledged by"), ("job-2", "resolved: job-2 was down")):
            loc = await outbox.where(f"incident:{n}:1")
            assert loc is not None and loc[0] == team
            message = fake_slack.message(team, loc[1])  # its line, updated in place
            assert message["thread_ts"] == story["ts"] and state in str(message["blocks"])
        assert outbox.failures == []


async def test_a_member_acknowledged_on_another_replica_while_its_grouped_post_is_on_its_way_lands_in_its_thread(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config
) -> None:
    """Two replicas on one Redis: while replica A's grouped post is held at Slack, a job acknowledged on replica B waits for it (A's claim is live) and its line, then its note, go in the story's thread; one top-level message, none lost or doubled."""
    team = "C0TEAM"
    jobs = Jobs(tmp_path)
    names = [f"job-{i}" for i in range(4)]
    cfgs = {n: _job(tmp_path, jobs, n, "gpu1", team) for n in names}
    hosts = {"gpu1": HostConfig(address="127.0.0.1")}  # never reached: the incidents are opened here
    async with (
        _pitstop(fake_slack, redis_config, hosts, cfgs, instance="replica-a") as (ctx_a, outbox_a),
        _pitstop(fake_slack, redis_config, hosts, cfgs, instance="replica-b") as (ctx_b, outbox_b),
    ):
        store = ctx_a.redis.open_store(IncidentStore)
        rnd = await _opened_dead(store, names, team)
        fake_slack.hold("chat.postMessage")
        telling = asyncio.create_task(tell(ctx_a, store, rnd))
        await fake_slack.wait_held("chat.postMessage")  # A's grouped post: in flight, its ts unknown
        await _member_of_story(store, "job-1")
        acking = asyncio.create_task(ack_command(ctx_b, "job-1", "U0ACK"))

        async def b_waits() -> bool:  # B has nothing of the story in this process: it waits on A's claim
            return int(outbox_b.queue()["channels"].get(team, {}).get("depth", 0)) >= 1

        await wait_until(b_waits, timeout=60)
        assert fake_slack.holding.get("chat.postMessage", 0) == 1  # B posted nothing meanwhile
        fake_slack.release()
        await asyncio.wait_for(asyncio.gather(telling, acking), 120)
        top = _top(fake_slack, team)
        assert len(top) == 1, [m["text"] for m in top]  # the story only
        story = top[0]
        assert str(story["text"]).startswith("4 jobs need attention on 1 host: 4 down")
        calls = await fake_slack.calls("chat.postMessage")
        assert all(c.ok for c in calls) and calls[0].args.get("thread_ts") is None
        assert {c.args.get("thread_ts") for c in calls[1:]} == {story["ts"]}
        posted = [str(c.args["text"]) for c in calls[1:]]
        lines = [f"{n} is down: no processes left on gpu1 (expected 1)" for n in names]
        acked = [i for i, t in enumerate(posted) if t.startswith("acknowledged by") and "job-1" in t]
        assert len(acked) == 1 and sorted(posted) == sorted(
            [*lines, posted[acked[0]]]
        )  # none lost, none twice
        assert posted.index(lines[1]) < acked[0]
        loc = await outbox_b.where("incident:job-1:1")
        assert loc is not None and loc[0] == team
        message = fake_slack.message(team, loc[1])  # its line, updated in place
        assert message["thread_ts"] == story["ts"] and "acknowledged by" in str(message["blocks"])
        assert outbox_a.failures == [] and outbox_b.failures == []


async def test_a_member_waits_for_a_claimed_grouped_post_only_while_its_replica_s_lease_is_live(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config
) -> None:
    """A replica claimed a grouped post and died before posting it: a job acknowledged on another replica waits until the claim's lease lapses, then posts its alert on its own, with the acknowledgement in its thread; nothing else, nothing twice."""
    team = "C0TEAM"
    jobs = Jobs(tmp_path)
    names = [f"job-{i}" for i in range(3)]
    cfgs = {n: _job(tmp_path, jobs, n, "gpu1", team) for n in names}
    hosts = {"gpu1": HostConfig(address="127.0.0.1")}
    async with _pitstop(fake_slack, redis_config, hosts, cfgs, instance="replica-b") as (ctx, outbox):
        store = ctx.redis.open_store(IncidentStore)
        for n in names:
            inc = Incident(
                job=n, host="gpu1", kind=IncidentKind.DEAD, opened_at=T0, notified_at=T0, story="story:gone"
            )
            assert await store.open(inc) is not None
        lease = 6.0
        assert await ctx.redis.open_store(Posts).claim("story:gone", "replica-a", lease=lease)  # then A died
        lapses = time.time() + lease
        await asyncio.wait_for(ack_command(ctx, "job-1", "U0ACK"), 120)
        assert time.time() >= lapses  # B waited for A's post while A's claim was live
        (own,) = _top(fake_slack, team)  # the story never came: job-1's alert is a message of its own
        assert "job-1" in str(own["text"]) and "acknowledged by" in str(own["blocks"])
        (note,) = fake_slack.thread(team, own["ts"])
        assert str(note["text"]).startswith("acknowledged by")
        assert len(await fake_slack.calls("chat.postMessage")) == 2 and outbox.failures == []


async def _opened_dead(store: IncidentStore, names: list[str], channel: str) -> Round:
    """A round opening a DEAD incident on ``gpu1`` for each of ``names`` (opened in ``store`` at
    ``T0``), told in ``channel``."""
    rnd = Round()
    for n in names:
        inc = await store.open(
            Incident(job=n, host="gpu1", kind=IncidentKind.DEAD, opened_at=T0, notified_at=T0)
        )
        assert inc is not None
        rnd.opened.append(Told(inc, channel, T0))
    return rnd


async def _member_of_story(store: IncidentStore, job: str) -> Incident:
    """``job``'s open incident once its story is recorded on it."""
    found: list[Incident] = []

    async def recorded() -> bool:
        inc = await store.incident(job)
        found[:] = [inc] if inc is not None and inc.story is not None else []
        return bool(found)

    await wait_until(recorded, timeout=30)
    return found[0]
