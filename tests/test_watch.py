"""The watcher: the pure incident state machine, its Redis store, causes found in logs, and
(end to end, real SSH and real processes) alerts, resolutions, stalls, degradation and ack."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.runtime.assembly import build_context, close_context
from handlers.context import Context
from handlers.outbox import MemoryOutbox, Posted
from handlers.watch.acks import ack_command, watch_command
from handlers.watch.cycle import Watcher
from pipeline.config import (
    AuthSettings,
    AutoRestart,
    Config,
    DigestSettings,
    JobConfig,
    SlackSettings,
    WatchSettings,
)
from pipeline.observe.crashes import detect_cause
from pipeline.observe.watch import ActionKind, Decision, Observation, Situation, assess
from pipeline.state import keys
from pipeline.state.events import EventKind
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore, WatchState
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord
from pipeline.verdict import Verdict
from tests.fixtures.ssh import HostUnderTest, InProcessHost, start_in_process

T0 = 1_700_000_000.0


def job_cfg(processes: int = 1, **watch: object) -> JobConfig:
    """A job config with short watch settings."""
    settings = {"interval": 1, "stall_after": 60, "degraded_after": 30, **watch}
    return JobConfig(
        host="gpu1",
        workdir="/w",
        launch=["./run.sh"],
        log="/w/train.log",
        match="worker",
        processes=processes,
        watch=WatchSettings(**settings),  # type: ignore[arg-type]
    )


def run_cycles(
    cfg: JobConfig,
    observations: list[Observation],
    situation: Situation | None = None,
    *,
    remind_every: float = 1800.0,
) -> list[Decision]:
    """Feed observations through assess, carrying state and incident as the watcher does."""
    state, incident = WatchState(), None
    out = []
    for obs in observations:
        d = assess("job", cfg, obs, state, incident, situation or Situation(), remind_every=remind_every)
        state, incident = d.state, d.incident
        if incident is not None and incident.n == 0:
            incident = incident.model_copy(update={"n": 1})
        out.append(d)
    return out


def kinds(decisions: list[Decision]) -> list[tuple[ActionKind, IncidentKind]]:
    """Every action of every decision as (action, incident kind)."""
    return [(a.kind, a.incident.kind) for d in decisions for a in d.actions]


def alive(t: float, count: int = 1, size: int | None = None) -> Observation:
    """An observation of ``count`` processes with a log of ``size`` bytes (growing by default)."""
    return Observation(
        at=T0 + t, count=count, pids=tuple(range(100, 100 + count)), log_size=size or int(t) + 1
    )


def dead(t: float) -> Observation:
    """An observation of no process."""
    return Observation(at=T0 + t, count=0, log_size=999)


def test_dead_after_alive_opens_one_incident_and_resolves_once() -> None:
    """A job seen alive that drops to zero opens one dead incident; coming back resolves it once."""
    ds = run_cycles(job_cfg(), [alive(0), alive(1), dead(2), dead(3), dead(4), alive(5), alive(6)])
    assert kinds(ds) == [(ActionKind.OPEN, IncidentKind.DEAD), (ActionKind.RESOLVE, IncidentKind.DEAD)]
    opened = ds[2].actions[0].incident
    assert opened.last_pid == 100 and opened.last_alive_at == T0 + 1
    assert ds[5].actions[0].incident.resolution == "running"


def test_never_seen_job_without_running_verdict_is_idle() -> None:
    """A job never seen alive and without a RUNNING verdict is not expected to run: no alert."""
    ds = run_cycles(job_cfg(), [dead(0), dead(1)])
    assert kinds(ds) == [] and ds[-1].condition == "idle"


def test_running_verdict_makes_a_never_seen_job_expected() -> None:
    """A current run with a RUNNING verdict makes zero processes an incident even if never seen."""
    ds = run_cycles(job_cfg(), [dead(0)], Situation(running_verdict=True))
    assert kinds(ds) == [(ActionKind.OPEN, IncidentKind.DEAD)]


def test_no_alert_while_a_restart_is_in_flight() -> None:
    """Zero processes during a planned restart (lock held / run unverified) is not an incident."""
    ds = run_cycles(job_cfg(), [alive(0), dead(1), dead(2)], Situation(in_flight=True))
    assert kinds(ds) == [] and ds[-1].condition == "in_flight"


def test_stopped_on_purpose_is_not_an_incident_and_resolves_an_open_one() -> None:
    """After ``stop JOB`` zero processes is expected; an open incident resolves as stopped."""
    cfg = job_cfg()
    state = run_cycles(cfg, [alive(0)])[-1].state
    d = assess("job", cfg, dead(5), state, None, Situation(stopped_at=T0 + 3))
    assert d.actions == () and d.condition == "idle"
    open_ = Incident(
        n=1, job="job", host="gpu1", kind=IncidentKind.DEAD, opened_at=T0 + 2, notified_at=T0 + 2
    )
    d = assess("job", cfg, dead(5), state, open_, Situation(stopped_at=T0 + 3))
    assert [(a.kind, a.incident.resolution) for a in d.actions] == [(ActionKind.RESOLVE, "stopped")]
    # started again by hand after the stop: expected once more
    state2 = assess("job", cfg, alive(6), state, None, Situation(stopped_at=T0 + 3)).state
    d = assess("job", cfg, dead(7), state2, None, Situation(stopped_at=T0 + 3))
    assert [a.kind for a in d.actions] == [ActionKind.OPEN]


def test_degraded_only_after_degraded_after_seconds() -> None:
    """5 of 8 processes opens a degraded incident only once it lasted degraded_after seconds."""
    cfg = job_cfg(processes=8, degraded_after=30)
    ds = run_cycles(cfg, [alive(0, 8), alive(10, 5), alive(20, 5), alive(39, 5), alive(40, 5), alive(50, 5)])
    assert kinds(ds) == [(ActionKind.OPEN, IncidentKind.DEGRADED)]
    assert ds[4].actions[0].incident.count == 5
    assert [d.condition for d in ds[1:4]] == ["pending"] * 3


def test_short_dip_in_count_is_not_degraded() -> None:
    """A count that recovers before degraded_after opens nothing."""
    cfg = job_cfg(processes=8, degraded_after=30)
    ds = run_cycles(cfg, [alive(0, 8), alive(10, 5), alive(20, 8), alive(35, 5), alive(50, 8)])
    assert kinds(ds) == []


def test_stall_when_the_log_stops_growing() -> None:
    """Alive with a log that stops growing for stall_after seconds → one stalled incident."""
    cfg = job_cfg(stall_after=60)
    obs = [alive(0, size=10), alive(30, size=20)] + [alive(t, size=20) for t in (60, 89, 90, 120)]
    ds = run_cycles(cfg, obs)
    assert kinds(ds) == [(ActionKind.OPEN, IncidentKind.STALLED)]
    assert ds[4].actions  # at t=90: 60 s after the last growth at t=30
    # the log grows again: resolved
    d = assess("job", cfg, alive(130, size=25), ds[-1].state, ds[-1].incident, Situation())
    assert [a.kind for a in d.actions] == [ActionKind.RESOLVE]


def test_open_incident_changes_kind_instead_of_alerting_again() -> None:
    """A degraded job that then dies changes the incident's kind: still one incident."""
    cfg = job_cfg(processes=8, degraded_after=10)
    ds = run_cycles(cfg, [alive(0, 8), alive(1, 5), alive(12, 5), dead(13), dead(14)])
    assert kinds(ds) == [(ActionKind.OPEN, IncidentKind.DEGRADED), (ActionKind.CHANGE, IncidentKind.DEAD)]
    assert ds[3].actions[0].previous is IncidentKind.DEGRADED


def test_reminders_repeat_until_acknowledged() -> None:
    """An open incident is re-posted every remind_every seconds until someone acks it."""
    cfg = job_cfg()
    ds = run_cycles(cfg, [alive(0), dead(1), dead(50), dead(102), dead(150), dead(203)], remind_every=100)
    assert kinds(ds) == [
        (ActionKind.OPEN, IncidentKind.DEAD),
        (ActionKind.REMIND, IncidentKind.DEAD),
        (ActionKind.REMIND, IncidentKind.DEAD),
    ]
    acked = ds[-1].incident
    assert acked is not None
    acked = acked.model_copy(update={"acked_by": "U1", "acked_at": T0 + 204})
    d = assess("job", cfg, dead(400), ds[-1].state, acked, Situation(), remind_every=100)
    assert d.actions == ()


def test_unreachable_host_is_its_own_incident_and_resolves_when_back() -> None:
    """A host unreachable for 3 cycles over 2 intervals opens an unreachable incident, resolved when it answers."""
    cfg = job_cfg()
    state = run_cycles(cfg, [alive(0)])[-1].state
    for t in (3, 4):  # two failed probes within 2 intervals: no verdict yet
        d = assess(
            "job", cfg, Observation(at=T0 + t, reachable=False, error="refused"), state, None, Situation()
        )
        assert d.actions == () and d.condition == "probe_failed"
        state = d.state
    down = Observation(at=T0 + 5, reachable=False, error="connection refused")
    d = assess("job", cfg, down, state, None, Situation())
    assert [(a.kind, a.incident.kind) for a in d.actions] == [(ActionKind.OPEN, IncidentKind.UNREACHABLE)]
    assert d.state.last_alive_at == state.last_alive_at  # nothing learnt about the job itself
    state = run_cycles(cfg, [alive(0)])[-1].state
    inc = d.incident
    assert inc is not None and inc.error == "connection refused"
    inc = inc.model_copy(update={"n": 1})
    d = assess("job", cfg, alive(9), d.state, inc, Situation())
    assert [(a.kind, a.incident.resolution) for a in d.actions] == [(ActionKind.RESOLVE, "reachable")]
    # back but the job died meanwhile: the unreachable incident resolves and a dead one opens
    d = assess("job", cfg, dead(9), state, inc, Situation())
    assert [(a.kind, a.incident.kind) for a in d.actions] == [
        (ActionKind.RESOLVE, IncidentKind.UNREACHABLE),
        (ActionKind.OPEN, IncidentKind.DEAD),
    ]


def test_auto_restart_backoff_then_give_up() -> None:
    """With auto_restart max 3, backoff 10: restarts at +10, +20, +40 after each crash, then gives up."""
    cfg = job_cfg(auto_restart=AutoRestart(max=3, within=3600, backoff=10))
    state = run_cycles(cfg, [alive(0)])[-1].state
    incident: Incident | None = None
    fired: list[float] = []
    gave_up = 0
    t = 1.0
    restarts = 0
    while t < 200:
        d = assess("job", cfg, dead(t), state, incident, Situation(auto_restarts=restarts))
        state, incident = d.state, d.incident
        if incident is not None and incident.n == 0:
            incident = incident.model_copy(update={"n": 1})
        for a in d.actions:
            if a.kind is ActionKind.AUTO_RESTART:
                fired.append(t)
                restarts += 1
            if a.kind is ActionKind.GIVE_UP:
                gave_up += 1
        t += 1
    assert fired == [11.0, 32.0, 73.0]  # 10 s, then 20 s, then 40 s after the previous attempt
    assert gave_up == 1
    assert incident is not None and incident.kind is IncidentKind.CRASH_LOOP and incident.gave_up


def test_in_flight_clears_a_planned_auto_restart() -> None:
    """A planned automatic restart is dropped while another restart is in flight."""
    cfg = job_cfg(auto_restart=AutoRestart(max=3, within=3600, backoff=10))
    state = run_cycles(cfg, [alive(0)])[-1].state
    d = assess("job", cfg, dead(1), state, None, Situation())
    assert d.incident is not None and d.incident.next_auto_at == T0 + 11
    d2 = assess("job", cfg, dead(2), d.state, d.incident, Situation(in_flight=True))
    assert d2.incident is not None and d2.incident.next_auto_at is None


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            'step 10\nTraceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
            "    x = 1 / 0\nZeroDivisionError: division by zero\n",
            "Python exception: ZeroDivisionError: division by zero",
        ),
        (
            'Traceback (most recent call last):\n  File "t.py", line 9\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
            "CUDA out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        (
            "[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=41) ran for 600016 milliseconds before timing out.\n",
            "NCCL timeout/watchdog: [rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=41) ran for 600016 milliseconds before timing out.",
        ),
        (
            "step 5 loss 2.1\n./run.sh: line 7:  4242 Killed                  python3 train.py\n",
            "killed by SIGKILL (`Killed`; no OOM line in the log)",
        ),
        ("step 5 loss 2.1\nKilled\n", "killed by SIGKILL (`Killed`; no OOM line in the log)"),
        ("step 1\nstep 2\n", None),
    ],
)
def test_detect_cause(log: str, expected: str | None) -> None:
    """Causes are found in a log tail: traceback's last line, CUDA OOM, NCCL watchdog, Killed."""
    assert detect_cause(log) == expected


# --- the Redis store ---------------------------------------------------------------------------


async def test_store_opens_once_and_updates_by_compare_and_set(redis_handle: RedisHandle) -> None:
    """Opening twice opens once; a stale revision cannot update or close; n counts incidents."""
    store = IncidentStore(redis_handle.client, redis_handle.prefix)
    inc = Incident(
        job="dflash", host="gpu1", kind=IncidentKind.DEAD, opened_at=T0, notified_at=T0, log="a\nb"
    )
    first = await store.open(inc)
    assert first is not None and first.n == 1 and first.rev == 1
    assert await store.open(inc) is None
    loaded = await store.incident("dflash")
    assert loaded == first
    acked = await store.update(first, first.model_copy(update={"acked_by": "U1"}))
    assert acked is not None and acked.rev == 2
    assert await store.update(first, first.model_copy(update={"acked_by": "U2"})) is None  # stale
    assert await store.close(first) is False
    assert await store.close(acked) is True
    assert await store.incident("dflash") is None
    second = await store.open(inc)
    assert second is not None and second.n == 2


async def test_racing_opens_open_one_incident_numbered_without_gaps(redis_handle: RedisHandle) -> None:
    """Of many processes opening an incident at once one opens it; the numbers have no gaps."""
    store = IncidentStore(redis_handle.client, redis_handle.prefix)
    inc = Incident(job="dflash", host="gpu1", kind=IncidentKind.DEAD, opened_at=T0, notified_at=T0)
    for n in (1, 2, 3):
        opened = [i for i in await asyncio.gather(*(store.open(inc) for _ in range(8))) if i is not None]
        assert [i.n for i in opened] == [n] and await store.incident("dflash") == opened[0]
        assert await store.close(opened[0])


async def test_store_state_round_trip_removes_cleared_fields(redis_handle: RedisHandle) -> None:
    """Watcher memory survives a round trip; fields set back to None are removed."""
    store = IncidentStore(redis_handle.client, redis_handle.prefix)
    st = WatchState(last_alive_at=T0, last_pid=42, log_size=10, progress_at=T0, degraded_since=T0)
    await store.save_states({"dflash": st})
    got = WatchState.model_validate(await store.hash(keys.watch_state(store.prefix, "dflash")))
    incident = await store.incident("dflash")
    assert got == st and incident is None
    await store.save_states({"dflash": st.model_copy(update={"degraded_since": None})})
    got = WatchState.model_validate(await store.hash(keys.watch_state(store.prefix, "dflash")))
    assert got.degraded_since is None and got.last_pid == 42


# --- end to end: real SSH host, real processes, real Restarter ------------------------------------
#
# The harness below is shared with tests/test_scheduler.py and tests/test_verdicts.py.

WORKER = r"""
import json, os, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
token = sys.argv[1]
if len(sys.argv) > 2 and sys.argv[2] == "child":
    time.sleep(3600)
    sys.exit(0)
with open(os.path.join(here, "mode.json")) as f:
    mode = json.load(f)
kids = [subprocess.Popen([sys.executable, __file__, token, "child"]) for _ in range(mode.get("procs", 1) - 1)]
start = time.time()
saved = os.path.join(here, "step.txt")  # with mode resume: steps go on from the last launch's
i = int(open(saved).read()) if mode.get("resume") and os.path.exists(saved) else 0
while True:
    if mode.get("lines") is None or i < mode["lines"]:
        print(json.dumps({"step": i, "tokens_per_s": 1000.0}), flush=True)
    i += 1
    if mode.get("resume"):
        with open(saved, "w") as f:
            f.write(str(i))
    if mode.get("exit_after") is not None and time.time() - start > mode["exit_after"]:
        raise RuntimeError("synthetic crash at step %d" % i)
    time.sleep(mode.get("period", 0.1))
"""


@dataclass
class Harness:
    """A Pitstop context watching real jobs on an in-process SSH host (``local``)."""

    host: HostUnderTest
    root: Path
    config: Config
    ctx: Context
    outbox: MemoryOutbox
    tokens: dict[str, str]
    extra: list[Context] = field(default_factory=list)

    def set_mode(self, job: str, **mode: object) -> None:
        """What the job's worker does on its next launch (procs, lines, exit_after, period, resume:
        its steps go on from where its last launch got, as from a checkpoint)."""
        (self.root / job / "mode.json").write_text(json.dumps(mode))

    async def launch(self, job: str, *, verify: bool = True, ctx: Context | None = None) -> RunRecord:
        """Start the job through the Restarter; verify it (the verdict) unless told not to."""
        c = ctx or self.ctx
        run = await c.runs.create(job, "U0TEST", action="start")
        run = await c.restarter.start(run)
        assert run.pid is not None, run.verdict_line
        if verify:
            run = await c.restarter.verify(run)
        return run

    async def sid(self, job: str) -> int:
        """The job's recorded session id."""
        current = await self.ctx.redis.client.hgetall(keys.job_current(self.ctx.redis.prefix, job))
        return int(current["sid"])

    async def kill(self, job: str) -> None:
        """SIGKILL the job's whole session, as a crash or the OOM killer would."""
        os.killpg(await self.sid(job), signal.SIGKILL)

    def pids(self, job: str) -> list[int]:
        """PIDs of live processes whose command line carries the job's token."""
        token = self.tokens[job].encode()
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            argv = cmd.split(b"\0")
            if len(argv) > 2 and argv[1].endswith(b"worker.py") and argv[2] == token and state != "Z":
                out.append(int(entry))
        return out

    def cleanup(self) -> None:
        """SIGKILL every process of every job."""
        for job in self.tokens:
            for pid in self.pids(job):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    async def context(self, instance: str, outbox: MemoryOutbox | None = None) -> Context:
        """Another Pitstop process (a replica) on the same Redis and host."""
        ctx = await build_context(self.config, outbox or MemoryOutbox(), instance=instance)
        self.extra.append(ctx)
        return ctx

    def alerts(self, outbox: MemoryOutbox | None = None) -> list[Posted]:
        """Alert headlines first posted (announce with the mention)."""
        box = outbox or self.outbox
        return [
            p
            for p in box.of("announce")
            if p.key and p.key.startswith("incident:") and MENTION in p.reply.lines[0]
        ]

    def thread(self, prefix: str, outbox: MemoryOutbox | None = None) -> list[Posted]:
        """Thread posts whose title starts with ``prefix``."""
        box = outbox or self.outbox
        return [p for p in box.of("thread") if p.reply.title.startswith(prefix)]


MENTION = "<!subteam^S0ONCALL>"


def job_config(
    root: Path,
    name: str,
    token: str,
    *,
    processes: int = 1,
    start_window: float = 1.0,
    digest: DigestSettings | None = None,
    **watch: Any,
) -> JobConfig:
    """A job running the worker script under ``root/name`` with a unique match token."""
    workdir = root / name
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "worker.py").write_text(WORKER)
    (workdir / "mode.json").write_text("{}")
    settings: dict[str, Any] = {"interval": 0.3, "stall_after": 30, "degraded_after": 30, **watch}
    return JobConfig(
        host="local",
        workdir=str(workdir),
        launch=[sys.executable, str(workdir / "worker.py"), token],
        log=str(workdir / "train.log"),
        match=re.escape(f"worker.py {token}"),
        processes=processes,
        start_window=start_window,
        stop_timeout=5,
        watch=WatchSettings(**settings),
        channel=f"C{name.upper()}",
        digest=digest or DigestSettings(),
    )


@contextlib.asynccontextmanager
async def open_harness(
    tmp_path: Path,
    redis_config: Config,
    jobs: dict[str, dict[str, Any] | JobConfig],
    host: HostUnderTest | None = None,
) -> AsyncIterator[Harness]:
    """A harness with the given jobs (name → job_config keyword arguments, or a JobConfig on host
    ``local`` as it is) on ``host`` (one of the SSH fixtures of tests/fixtures/ssh.py), or on an
    in-process asyncssh host of its own."""
    own = await start_in_process(tmp_path / "sshhost") if host is None else None
    host = host or own
    assert host is not None
    tokens = {name: uuid.uuid4().hex for name in jobs}
    root = tmp_path / "jobs"
    config = redis_config.model_copy(
        update={
            "hosts": {"local": host.host_config(connect_timeout=5)},
            "jobs": {
                n: kw if isinstance(kw, JobConfig) else job_config(root, n, tokens[n], **kw)
                for n, kw in jobs.items()
            },
            "slack": SlackSettings(alert_mention="S0ONCALL", announce_channel="CANNOUNCE"),
            "auth": AuthSettings(operators=["U0TEST"], viewers=["*"]),
        }
    )
    outbox = MemoryOutbox()
    ctx = await build_context(config, outbox, instance="A")
    ctx.restarter.verify_poll = 0.1
    h = Harness(host, root, config, ctx, outbox, tokens)
    try:
        yield h
    finally:
        h.cleanup()
        for c in [*h.extra, ctx]:
            await close_context(c)
        if own is not None:
            await own.host.close()


async def until(
    predicate: Callable[[], Awaitable[bool]],
    timeout: float,
    step: Callable[[], Awaitable[object]] | None = None,
) -> bool:
    """Run ``step`` (a watch cycle, say) and poll ``predicate`` until true or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            await step()
        if await predicate():
            return True
        if step is None:
            await asyncio.sleep(0.05)
    return False


async def cycles_for(watcher: Watcher, seconds: float) -> None:
    """Run watch cycles back to back for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await watcher.cycle("local")


JOBS: dict[str, dict[str, Any]] = {
    "train": {"stall_after": 1.5, "warmup": 0.5},  # its worker logs steps: no warm-up to wait out
    "pipe": {"processes": 8, "degraded_after": 1.0, "start_window": 1.5},
}


@pytest.fixture
async def harness(tmp_path: Path, redis_config: Config) -> AsyncIterator[Harness]:
    """One job ``train`` (1 process) and one ``pipe`` (8 processes), fast watch settings."""
    async with open_harness(tmp_path, redis_config, JOBS) as h:
        yield h


async def test_kill_alerts_once_and_restart_resolves_once(
    any_ssh_host: HostUnderTest, tmp_path: Path, redis_config: Config
) -> None:
    """Killing a running job posts exactly one alert; restarting it posts one resolved message,
    and the planned restart itself raises no alert (over asyncssh and over OpenSSH sshd)."""
    async with open_harness(tmp_path, redis_config, JOBS, any_ssh_host) as h:
        await _kill_alerts_once_and_restart_resolves_once(h)


async def _kill_alerts_once_and_restart_resolves_once(h: Harness) -> None:
    ctx = h.ctx
    watcher = Watcher(ctx)
    run = await h.launch("train")
    assert run.verdict is Verdict.RUNNING
    await watcher.cycle("local", ["train"])
    assert h.alerts() == []
    after = await ctx.events.last_id()
    await h.kill("train")
    assert await until(lambda: _true(h.alerts()), 10, lambda: watcher.cycle("local", ["train"]))
    event = await ctx.events.wait_for(EventKind.ALERT, "train", after=after, timeout=5)
    assert event is not None and event.data["alert"] == "dead"
    await cycles_for(watcher, 1.0)
    alerts = h.alerts()
    assert len(alerts) == 1
    alert = alerts[0].reply
    assert alert.title.startswith("train is down") and alerts[0].channel == "CTRAIN"
    fields = dict(alert.fields)
    assert fields["host"] == "local" and fields["last PID"] == str(run.pid)
    assert fields["exit cause"].startswith("killed by SIGKILL")
    assert alert.log is not None and '"step"' in alert.log
    # a planned restart: the job is down and coming back, cycles run throughout, no new alert
    rerun = await ctx.runs.create("train", "U0TEST")
    restart = asyncio.ensure_future(ctx.restarter.restart(rerun))
    while not restart.done():
        await watcher.cycle("local", ["train"])
    rerun = await ctx.restarter.verify(await restart)
    assert rerun.verdict is Verdict.RUNNING
    assert await until(
        lambda: _true(h.thread("resolved after")), 10, lambda: watcher.cycle("local", ["train"])
    )
    await cycles_for(watcher, 0.6)
    resolved = h.thread("resolved after")
    assert len(resolved) == 1 and resolved[0].key == alerts[0].key
    assert len(h.alerts()) == 1
    headline = [p for p in h.outbox.of("announce") if p.key == alerts[0].key][-1]
    assert headline.reply.title.startswith("resolved: train was down")
    assert await ctx.events.wait_for(EventKind.RESOLVED, "train", after=after, timeout=5) is not None


async def test_no_alert_during_a_planned_restart(harness: Harness) -> None:
    """A restart in flight (job down between stop and launch) is never reported as dead."""
    h, ctx = harness, harness.ctx
    watcher = Watcher(ctx)
    await h.launch("train")
    await watcher.cycle("local", ["train"])
    rerun = await ctx.runs.create("train", "U0TEST")
    restart = asyncio.ensure_future(ctx.restarter.restart(rerun))
    seen_in_flight = False
    while not restart.done():
        decisions = await watcher.cycle("local", ["train"])
        seen_in_flight |= decisions["train"].condition == "in_flight"
    await ctx.restarter.verify(await restart)
    await cycles_for(watcher, 0.6)
    assert seen_in_flight
    assert h.alerts() == [] and ctx.outbox.of("thread") == []


async def test_stalled_job_alerts_once(harness: Harness) -> None:
    """A job that stays alive but stops writing its log gets one stalled alert."""
    h, ctx = harness, harness.ctx
    watcher = Watcher(ctx)
    h.set_mode("train", lines=3, period=0.05)
    run = await h.launch("train")
    assert run.verdict is Verdict.RUNNING
    assert await until(lambda: _true(h.alerts()), 10, lambda: watcher.cycle("local", ["train"]))
    await cycles_for(watcher, 0.6)
    alerts = h.alerts()
    assert len(alerts) == 1 and alerts[0].reply.title.startswith("train has stalled")
    assert h.pids("train")  # still alive


async def test_five_of_eight_is_one_degraded_alert_and_ack_silences_reminders(harness: Harness) -> None:
    """Eight processes dropping to five for degraded_after gives one degraded alert; reminders
    repeat until ``ack``, then stop; the headline says who acknowledged."""
    h, ctx = harness, harness.ctx
    watcher = Watcher(ctx, remind_every=0.4)
    h.set_mode("pipe", procs=8)
    run = await h.launch("pipe")
    assert run.verdict is Verdict.RUNNING, run.verdict_line
    children = [p for p in h.pids("pipe") if p != run.pid]
    assert len(children) == 7
    for pid in children[:3]:  # three ranks die: a hung NCCL job keeps the other five
        os.kill(pid, signal.SIGKILL)
    assert await until(lambda: _true(h.alerts()), 10, lambda: watcher.cycle("local", ["pipe"]))
    alerts = h.alerts()
    assert len(alerts) == 1 and alerts[0].reply.title == "pipe is degraded: 5/8 processes on local"
    assert await until(
        lambda: _true(h.thread(f"{MENTION} still degraded")), 10, lambda: watcher.cycle("local", ["pipe"])
    )
    reply = await ack_command(ctx, "PIPE", "U0ACK")
    assert reply.title.startswith("acknowledged by <@U0ACK>")
    reminders = len(h.thread(f"{MENTION} still degraded"))
    await cycles_for(watcher, 1.2)
    assert len(h.thread(f"{MENTION} still degraded")) == reminders
    assert len(h.alerts()) == 1
    headline = [p for p in h.outbox.of("announce") if p.key == alerts[0].key][-1]
    assert ("acknowledged by", "<@U0ACK>") in headline.reply.fields
    again = await ack_command(ctx, "pipe", "U0OTHER")
    assert again.title.startswith("the pipe incident was already acknowledged by <@U0ACK>")


async def test_unreachable_host_is_its_own_incident(harness: Harness) -> None:
    """A host that stops answering (confirmed on a fresh connection) is 'host unreachable', not dead."""
    h, ctx = harness, harness.ctx
    watcher = Watcher(ctx)
    await h.launch("train")
    await watcher.cycle("local", ["train"])
    assert isinstance(h.host, InProcessHost)
    await h.host.host.close()  # stops listening and drops the pooled connection
    seen: list[str] = []

    async def cycle() -> None:
        seen.append((await watcher.cycle("local", ["train"]))["train"].condition)

    assert await until(lambda: _true(h.alerts()), 10, cycle)
    assert seen[0] == "probe_failed" and seen[-1] == "unreachable" and len(seen) >= 3
    alerts = h.alerts()
    assert len(alerts) == 1 and alerts[0].reply.title == "host local unreachable - cannot check train"
    await watcher.cycle("local", ["train"])
    assert len(h.alerts()) == 1


async def test_host_down_from_the_first_cycle_is_unreachable(harness: Harness) -> None:
    """A host that never answered (no watch state stored yet) is reported unreachable after its failed probes; no cycle fails."""
    h, ctx = harness, harness.ctx
    watcher = Watcher(ctx)
    assert isinstance(h.host, InProcessHost)
    await h.host.host.close()
    interval, start = ctx.config.jobs["train"].watch.interval, time.time()
    seen = [
        (await watcher.cycle("local", ["train"], now=start + i * (interval + 0.5)))["train"].condition
        for i in range(3)
    ]
    assert seen == ["probe_failed", "probe_failed", "unreachable"]
    assert len(h.alerts()) == 1


async def test_watch_off_pauses_and_expires(harness: Harness) -> None:
    """``watch JOB off for N`` skips the job until it expires; ``on`` resumes at once."""
    ctx = harness.ctx
    watcher = Watcher(ctx)
    reply = await watch_command(ctx, "train", "off", 1, "U0TEST")
    assert reply.title.startswith("watching train paused for 1 s")
    assert await watcher.cycle("local", ["train"]) == {}
    assert await until(lambda: _has(watcher), 5)
    await watch_command(ctx, "train", "off", None, "U0TEST")
    ttl = await ctx.redis.client.ttl(keys.watch_off(ctx.redis.prefix, "train"))
    assert 86000 < ttl <= 86400
    reply = await watch_command(ctx, "train", "on", None, "U0TEST")
    assert reply.title == "watching train again"
    assert "train" in await watcher.cycle("local", ["train"])
    bad = await watch_command(ctx, "trian", "on", None, "U0TEST")
    assert bad.title == "no job called 'trian' - did you mean train?" and bad.ephemeral


async def test_ack_without_incident(harness: Harness) -> None:
    """``ack`` with nothing open says so and changes nothing."""
    reply = await ack_command(harness.ctx, "train", "U0TEST")
    assert reply.title == "no open incident for train - nothing to acknowledge"
    assert harness.outbox.posted == []


async def _has(watcher: Watcher) -> bool:
    return "train" in await watcher.cycle("local", ["train"])


async def _true(value: object) -> bool:
    return bool(value)
