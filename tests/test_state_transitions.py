"""Run state changes only through its stores' transitions: an illegal one is refused with its code."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline.config import Config
from pipeline.errors import IllegalTransition, error_class
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore
from pipeline.state.locks import JobLock
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import Claim, RunRecord, RunState, RunStore, StepRecord, VerifyQueue
from pipeline.verdict import Outcome, Step, Verdict


def _refused(info: pytest.ExceptionInfo[IllegalTransition], current: str, wanted: str) -> None:
    exc = info.value
    assert exc.code == "illegal_transition" and error_class(exc.code) is IllegalTransition
    assert (exc.current, exc.wanted) == (current, wanted)


async def _launched(runs: RunStore) -> RunRecord:
    run = await runs.create("dflash", "U1")
    run.steps.append(
        StepRecord(step=Step.LAUNCH, started_at=time.time(), ended_at=time.time(), outcome=Outcome.OK)
    )
    await runs.record_step(run)
    return run


async def test_a_run_is_finished_once(redis_handle: RedisHandle) -> None:
    """A run its sequence ended cannot be finished again, nor given a verdict by verification."""
    runs = redis_handle.open_store(RunStore)
    run = await runs.create("dflash", "U1")
    assert RunState.of(run) is RunState.OPEN
    await runs.finish(run, Verdict.PREFLIGHT_FAILED, "PREFLIGHT_FAILED disk")
    assert RunState.of(await runs.get(run.id)) is RunState.ENDED
    with pytest.raises(IllegalTransition) as info:
        await runs.finish(run, Verdict.INTERRUPTED, "INTERRUPTED")
    _refused(info, "ended", "finish")
    with pytest.raises(IllegalTransition) as info:
        await runs.decide(run, Verdict.RUNNING, "RUNNING 8/8", "")
    _refused(info, "ended", "decide")
    assert (await runs.get(run.id)).verdict is Verdict.PREFLIGHT_FAILED  # nothing was written


async def test_a_verified_run_is_verified_again_but_never_finished(redis_handle: RedisHandle) -> None:
    """A launched run's verdict may be decided again (re-verification); its sequence cannot end it after."""
    runs = redis_handle.open_store(RunStore)
    run = await _launched(runs)
    assert RunState.of(run) is RunState.AWAITING
    await runs.decide(run, Verdict.PENDING, "PENDING", "")
    assert RunState.of(run) is RunState.AWAITING
    await runs.decide(run, Verdict.RUNNING, "RUNNING 8/8", "")
    await runs.decide(run, Verdict.EXITED, "EXITED code 1", "tail")
    assert RunState.of(await runs.get(run.id)) is RunState.DECIDED
    with pytest.raises(IllegalTransition) as info:
        await runs.finish(run, Verdict.INTERRUPTED, "INTERRUPTED")
    _refused(info, "decided", "finish")


async def test_a_stale_copy_never_overwrites_a_newer_record(redis_handle: RedisHandle) -> None:
    """A copy read before another write is refused, naming the stored state; the newer record stays."""
    runs = redis_handle.open_store(RunStore)
    run = await _launched(runs)
    stale = await runs.get(run.id)
    await runs.decide(run, Verdict.RUNNING, "RUNNING 8/8", "")
    stale.steps.append(StepRecord(step=Step.VERIFY, started_at=time.time()))
    with pytest.raises(IllegalTransition) as info:
        await runs.record_step(stale)
    _refused(info, "decided at revision 2 (read at 1)", "record a step")
    with pytest.raises(IllegalTransition) as info:
        await runs.decide(stale, Verdict.EXITED, "EXITED code 1", "tail")
    _refused(info, "decided at revision 2 (read at 1)", "decide")
    with pytest.raises(IllegalTransition) as info:
        await runs.finish(stale, Verdict.INTERRUPTED, "INTERRUPTED")
    _refused(info, "decided at revision 2 (read at 1)", "finish")
    assert stale.verdict is None and stale.rev == 1  # a refused copy is left as it was
    stored = await runs.get(run.id)
    assert (stored.verdict, stored.rev, stored.step(Step.VERIFY)) == (Verdict.RUNNING, 2, None)


RACES = 40  #: runs two processes race to end


def _racer(address: str, prefix: str, me: str, plan: list[tuple[str, str]], barrier: Any, out: Any) -> None:
    """One process with its own connection: for each run, read it, wait for the other, then end it."""

    async def race() -> list[tuple[str, str, str]]:
        runs = RunStore(aioredis.Redis.from_url(address, decode_responses=True), prefix)
        got = []
        for run_id, wanted in plan:
            run = await runs.get(run_id)
            barrier.wait(10)
            try:
                if wanted == "finish":
                    await runs.finish(run, Verdict.INTERRUPTED, f"INTERRUPTED by {me}")
                else:
                    await runs.decide(run, Verdict.RUNNING, f"RUNNING by {me}", "")
                got.append((run_id, "won", ""))
            except IllegalTransition as exc:
                got.append((run_id, exc.code, exc.current))
        await runs.client.aclose()
        return got

    out.put((me, asyncio.run(race())))


async def test_two_processes_racing_to_end_a_run_one_wins(
    redis_handle: RedisHandle, redis_config: Config
) -> None:
    """Two OS processes, each with its own connection, end the same run at once, many times: exactly
    one wins each race and its write is the one stored; the other gets the code, naming the stored state."""
    runs = redis_handle.open_store(RunStore)
    ids = [(await _launched(runs)).id for _ in range(RACES)]
    address = redis_config.redis.url or f"unix://{redis_handle.embedded.socket_file}"
    mp = multiprocessing.get_context("spawn")
    barrier, out = mp.Barrier(2), mp.Queue()
    plans = {
        "A": [(i, "decide") for i in ids],
        "B": [(i, ("finish", "decide")[n % 2]) for n, i in enumerate(ids)],
    }
    procs = [
        mp.Process(target=_racer, args=(address, redis_handle.prefix, me, plan, barrier, out))
        for me, plan in plans.items()
    ]
    for proc in procs:
        proc.start()
    try:
        results = dict(await asyncio.to_thread(lambda: [out.get(timeout=60) for _ in procs]))
    finally:
        for proc in procs:
            proc.join(10)
            proc.kill()
    for n, run_id in enumerate(ids):
        a, b = results["A"][n], results["B"][n]
        assert a[0] == b[0] == run_id and sorted([a[1], b[1]]) == ["illegal_transition", "won"], (a, b)
        winner, (_, _, current) = ("A", b) if a[1] == "won" else ("B", a)
        stored = await runs.get(run_id)
        assert (
            stored.rev == 2
            and stored.verdict_line is not None
            and stored.verdict_line.endswith(f"by {winner}")
        )
        assert current.startswith(RunState.of(stored).value)


async def test_releasing_a_lock_not_held_is_refused(redis_handle: RedisHandle) -> None:
    """A lock object releases only what it took; and it is single-use."""
    lock = redis_handle.open_store(JobLock, "job:dflash", ttl=5)
    with pytest.raises(IllegalTransition) as info:
        await lock.release()
    _refused(info, "not held by this object", "release")
    await lock.acquire(job="dflash", action="restart", user="U1")
    await lock.release()
    await lock.release()  # releasing twice what it took is safe
    with pytest.raises(IllegalTransition) as info:
        await lock.acquire(job="dflash", action="restart", user="U1")
    _refused(info, "taken by this object before", "acquire")


async def test_only_the_claims_holder_marks_a_verification_done(redis_handle: RedisHandle) -> None:
    """Done de-queues a verification only for the holder of its claim; the run stays queued otherwise."""
    queue = redis_handle.open_store(VerifyQueue)
    await queue.enqueue("r-1", 10.0)
    with pytest.raises(IllegalTransition) as info:
        await queue.done(Claim("r-1", "nobody", 5.0))
    _refused(info, "not claimed by this holder", "be done")
    assert await queue.due_at("r-1") == 10.0
    claim = await queue.claim("r-1", "me", 5.0)
    assert claim is not None and await queue.claim("r-1", "you", 5.0) is None
    await queue.settle("r-1")  # decided during the delivery: stays queued until done
    assert await queue.due_at("r-1") == 10.0
    await queue.done(claim)
    assert await queue.due_at("r-1") is None and await queue.claim("r-1", "you", 5.0) is None
    with pytest.raises(IllegalTransition):
        await queue.done(Claim("r-1", "you", 5.0))


async def test_an_incident_never_opened_cannot_be_resolved(redis_handle: RedisHandle) -> None:
    """Resolving or changing an incident that was never opened is refused; an opened one resolves once."""
    store = redis_handle.open_store(IncidentStore)
    draft = Incident(job="dflash", host="gpu1", kind=IncidentKind.DEAD, opened_at=1.0, notified_at=1.0)
    with pytest.raises(IllegalTransition) as info:
        await store.close(draft)
    _refused(info, "never opened", "resolve")
    with pytest.raises(IllegalTransition):
        await store.update(draft, draft)
    opened = await store.open(draft)
    assert opened is not None and await store.close(opened) and not await store.close(opened)
