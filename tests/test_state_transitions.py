"""Run state changes only through its stores' transitions: an illegal one is refused with its code."""

from __future__ import annotations

import time

import pytest

from pipeline.errors import IllegalTransition, error_class
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore
from pipeline.state.locks import JobLock
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord, RunState, RunStore, StepRecord
from pipeline.state.verifications import Claim, VerifyQueue
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
    await runs.save(run)
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
