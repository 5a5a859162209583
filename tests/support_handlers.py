"""Shared parts of the handler tests: a config, a Context on real Redis, and a real-Redis
stand-in for the Restarter (the lock, dedupe, auth and confirmation are what those tests
prove; the real restart sequence has its own tests, and test_dispatch runs it end to end).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from handlers.context import Context
from handlers.outbox import MemoryOutbox
from pipeline.config import Config, JobConfig, parse_config
from pipeline.engines import ENGINES
from pipeline.engines.base import (
    Engine,
    Entry,
    NodeOutputs,
    Reads,
    Sighting,
    StepListener,
    Target,
)
from pipeline.engines.runner import Runner, look
from pipeline.engines.steplog import StepLog
from pipeline.errors import GroupsUnknown, HostUnreachable
from pipeline.host.probe import LogChunk, read_log_chunk
from pipeline.host.remote import RemoteHosts, RemoteResult
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord, RunStore, StepRecord
from pipeline.verdict import Outcome, Step, Verdict

ADMIN = "U0ADMIN0001"
OPERATOR = "U0OPERATOR1"
VIEWER = "U0VIEWER001"
OPS_GROUP = "S0OPSGROUP1"
NOBODY_GROUP = "S0NOBODY001"


def handler_config(**jobs_extra: dict[str, Any]) -> Config:
    """Two hosts; jobs ``dflash`` (patches topk, fast, old), ``guarded`` (confirm = true),
    ``eagle`` (on gpu1 too, lock_scope = host) and ``solo`` (own auth: only U0SOLO00001 operates)."""
    job = {"workdir": "/srv/w", "launch": ["./run.sh"], "log": "/srv/w/train.log", "match": "^w "}
    data: dict[str, Any] = {
        "slack": {"announce_channel": "C0ANNOUNCE1"},
        "auth": {"admins": [ADMIN], "operators": [OPERATOR, OPS_GROUP], "viewers": ["*"]},
        "hosts": {"gpu1": {"address": "127.0.0.1"}, "gpu2": {"address": "127.0.0.2"}},
        "jobs": {
            "dflash": {
                **job,
                "host": "gpu1",
                "patches": {"topk": "/p/topk.diff", "fast": "/p/fast.diff", "old": "/p/old.diff"},
                "start_window": 1,
            },
            "guarded": {**job, "host": "gpu2", "confirm": True},
            "eagle": {**job, "host": "gpu1", "lock_scope": "host"},
            "solo": {**job, "host": "gpu2", "auth": {"operators": ["U0SOLO00001"]}},
        },
    }
    for name, extra in jobs_extra.items():
        data["jobs"][name] = {**data["jobs"].get(name, job), **extra}
    return parse_config(data)


class FakeSSH:
    """Stands in for the SSH pool (:class:`~pipeline.host.remote.RemoteHosts`) in tests that never
    reach a host: every host is unreachable."""

    async def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: str | None = None,
        display: Sequence[str] | None = None,
    ) -> RemoteResult:
        """Raise :class:`HostUnreachable`."""
        raise HostUnreachable(host, "the test's stand-in reaches no host")

    async def run_job(
        self,
        job: str,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: str | None = None,
        display: Sequence[str] | None = None,
    ) -> RemoteResult:
        """Raise :class:`HostUnreachable`."""
        raise HostUnreachable(job, "the test's stand-in reaches no host")

    async def check(self, host: str) -> None:
        """Raise :class:`HostUnreachable`."""
        raise HostUnreachable(host, "the test's stand-in reaches no host")

    async def close(self) -> None:
        """Nothing to close."""


class StandInRestarter(Runner):
    """Real-Redis test double for the run service's :class:`~pipeline.engines.runner.Runner`
    (its interface; its ``__init__`` is not called).

    Walks the steps (recording each on the run and telling the subscribed listeners as the real
    one does), checks cancel requests and ``cancelled`` at step boundaries, sleeps ``step_s`` per step (``launch_s``
    for the launch), and records every call in a Redis list and the highest number of
    sequences running at once, so a test sees what ran across processes.
    """

    def __init__(
        self,
        config: Config,
        runs: RunStore,
        *,
        step_s: float = 0.2,
        launch_s: float = 0.2,
        after_launch_s: float = 0.0,
        log_text: str = "step 1\nstep 2\n",
        log_error: Exception | None = None,
        ssh: RemoteHosts | None = None,
    ) -> None:
        self.config = config
        self.runs = runs
        self.ssh: RemoteHosts = ssh if ssh is not None else FakeSSH()
        self.client = runs.client
        self.calls_key = f"{runs.prefix}test:calls"
        self.active_key = f"{runs.prefix}test:active"
        self.peak_key = f"{runs.prefix}test:peak"
        self.step_s = step_s
        self.launch_s = launch_s
        self.after_launch_s = after_launch_s
        self.log_text = log_text
        self.log_error = log_error
        self.launched = asyncio.Event()
        self.in_launch = asyncio.Event()
        self._listeners: list[StepListener] = []

    def subscribe(self, listener: StepListener) -> Callable[[], None]:
        """Tell ``listener`` of every step change, as :meth:`StepLog.subscribe` does."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def _tell(self, run: RunRecord, rec: StepRecord) -> None:
        for listener in list(self._listeners):
            if (pending := listener(run, rec)) is not None:
                await pending

    async def calls(self) -> list[dict[str, object]]:
        """Every call so far, oldest first."""
        return [json.loads(x) for x in await self.client.lrange(self.calls_key, 0, -1)]

    async def peak(self) -> int:
        """The most sequences that ran at once."""
        return int(await self.client.get(self.peak_key) or 0)

    async def _step(
        self,
        run: RunRecord,
        step: Step,
        seconds: float,
    ) -> None:
        rec = StepRecord(step=step, started_at=time.time())
        run.steps.append(rec)
        await self.runs.record_step(run)
        await self._tell(run, rec)
        if step is Step.LAUNCH:
            self.in_launch.set()
        await asyncio.sleep(seconds)
        rec.ended_at = time.time()
        rec.outcome = Outcome.OK
        rec.detail = f"{step.value} done"
        await self.runs.record_step(run)
        await self._tell(run, rec)

    async def _sequence(
        self,
        action: str,
        run: RunRecord,
        steps: Sequence[Step],
        cancelled: Callable[[], Awaitable[bool]] | None,
        **details: object,
    ) -> RunRecord:
        await self.client.rpush(self.calls_key, json.dumps({"action": action, "run": run.id, **details}))
        active = await self.client.incr(self.active_key)
        peak = int(await self.client.get(self.peak_key) or 0)
        if active > peak:
            await self.client.set(self.peak_key, active)
        try:
            for step in steps:
                if await self.runs.cancel_requested(run.id) or (cancelled is not None and await cancelled()):
                    after = run.current_step.value if run.current_step else None
                    return await self.runs.finish(run, Verdict.CANCELLED, f"cancelled after {after}")
                await self._step(run, step, self.launch_s if step is Step.LAUNCH else self.step_s)
            if Step.LAUNCH in steps:
                run.pid = 4242
                run.launched_at = time.time()
                rec = StepRecord(step=Step.VERIFY, started_at=time.time(), outcome=Outcome.WAITING)
                run.steps.append(rec)
                await self.runs.record_step(run)
                await self._tell(run, rec)
                self.launched.set()
                await asyncio.sleep(self.after_launch_s)
            else:
                await self.runs.finish(run)
            return run
        finally:
            await self.client.decr(self.active_key)

    async def restart(
        self,
        run: RunRecord,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
        fresh_cache: bool = False,
        cancelled: Callable[[], Awaitable[bool]] | None = None,
    ) -> RunRecord:
        """Walk preflight → stop → clear_cache → patch → launch; leave verify WAITING."""
        steps = [Step.PREFLIGHT, Step.STOP, Step.CLEAR_CACHE, Step.PATCH, Step.LAUNCH]
        return await self._sequence(
            "restart",
            run,
            steps,
            cancelled,
            add=list(add),
            remove=list(remove),
            fresh_cache=fresh_cache,
        )

    async def start(
        self,
        run: RunRecord,
        *,
        cancelled: Callable[[], Awaitable[bool]] | None = None,
    ) -> RunRecord:
        """Walk preflight → launch."""
        return await self._sequence("start", run, [Step.PREFLIGHT, Step.LAUNCH], cancelled)

    async def stop(self, run: RunRecord) -> RunRecord:
        """Walk stop; finish the run."""
        return await self._sequence("stop", run, [Step.STOP], None)

    async def verify(self, run: RunRecord) -> RunRecord:
        """Not simulated: the handler tests that verify use the real Restarter."""
        raise NotImplementedError("StandInRestarter does not verify")

    async def read_chunk(self, name: str, job: JobConfig, offset: int, length: int, *, path: str) -> LogChunk:
        """The job's file over this stand-in's SSH."""
        return await read_log_chunk(self.ssh, name, job, offset, length, path=path)

    async def patches_in_effect(self, job: str) -> list[str]:
        """None applied."""
        return []

    async def sightings(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """What the registered engines see over this stand-in's SSH (a FakeSSH answers probes)."""
        return await look({n: make(self.ssh, self._steps()) for n, make in ENGINES.items()}, entries, reads)

    async def _target(self, job: str) -> tuple[Engine, Target]:
        """The registered engine over this stand-in's SSH, with the stand-in's looks (:class:`_Looks`)."""
        name, steps = self.config.job_name(job), self._steps()
        spec = self.config.jobs[name]
        looks = _Looks(ENGINES[spec.engine](self.ssh, steps), self)
        return cast(Engine, looks), Target(name, spec, await steps.records.current(name))

    def _steps(self) -> StepLog:
        return StepLog(self.runs, Events(self.runs.client, self.runs.prefix))


class _Looks:
    """An engine whose ``log_tail`` is the stand-in's configured text (or error) and whose
    ``node_outputs`` is None (every job's host answers ``gpus HOST``); the rest is ``engine``'s."""

    def __init__(self, engine: Engine, restarter: StandInRestarter) -> None:
        self.engine, self.restarter = engine, restarter

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def log_tail(self, t: Target, lines: int) -> str:
        """The configured text (or raise the configured error)."""
        if self.restarter.log_error is not None:
            raise self.restarter.log_error
        return self.restarter.log_text

    async def node_outputs(self, t: Target, argv: Sequence[str]) -> NodeOutputs | None:
        """None: every job's host answers ``gpus HOST``."""
        return None


class GroupBook:
    """A :class:`handlers.context.Directory` as Slack's ``usergroups.list`` would answer it: group id
    → its members, editable by a test (someone leaves a group); ``down`` makes every look-up fail
    closed, as :class:`bot.slack.people.People` does once the listing has failed past its TTL."""

    def __init__(self, groups: dict[str, list[str]] | None = None) -> None:
        self.groups = {OPS_GROUP: ["U0OPSMEMBER"]} if groups is None else groups
        self.down = False

    async def fresh_groups(self, user: str) -> tuple[str, ...]:
        """The groups ``user`` is in.  :raises GroupsUnknown: while ``down``."""
        if self.down:
            raise GroupsUnknown(120.0)
        return tuple(g for g, members in self.groups.items() if user in members)


def make_context(
    config: Config,
    handle: RedisHandle,
    *,
    restarter: Runner | None = None,
    outbox: MemoryOutbox | None = None,
    directory: GroupBook | None = None,
) -> Context:
    """A Context on real Redis with the stand-in restarter (unless one is given) and a
    :class:`GroupBook` (``U0OPSMEMBER`` in ``OPS_GROUP``, unless one is given)."""
    runs = RunStore(handle.client, handle.prefix)
    return Context(
        config=config,
        redis=handle,
        ssh=FakeSSH(),
        runs=runs,
        restarter=restarter if restarter is not None else StandInRestarter(config, runs),
        events=Events(handle.client, handle.prefix),
        outbox=outbox if outbox is not None else MemoryOutbox(),
        instance="test-instance",
        directory=directory if directory is not None else GroupBook(),
    )


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 30.0, every: float = 0.02
) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(every)
