"""The job-state store: one pipelined read of every key that holds a job's state."""

from __future__ import annotations

import time

from pipeline.state import keys
from pipeline.state.incidents import Incident, IncidentKind
from pipeline.state.jobstate import JobStore, scope_of
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from tests.support_handlers import handler_config

CONFIG = handler_config(dflash={"watch": {"auto_restart": {"within": 600}}})


def test_scope_of_is_per_job_or_per_host() -> None:
    """A job's lock scope is ``job:NAME``, or ``host:HOST`` with lock_scope = "host"."""
    assert scope_of(CONFIG, "dflash") == "job:dflash"
    assert scope_of(CONFIG, "eagle") == "host:gpu1"


async def test_snapshot_of_a_job_never_launched_is_empty(redis_handle: RedisHandle) -> None:
    """A job with nothing in Redis reads as an empty, unlocked, unpaused snapshot."""
    snap = await JobStore(redis_handle.client, redis_handle.prefix, CONFIG).read("guarded")
    assert snap.current == {} and snap.patches == () and not snap.lock_held and not snap.paused
    assert snap.incident is None and snap.latest is None and not snap.unverified
    assert snap.run_id is None and snap.pid == "" and snap.uptime(time.time()) is None


async def test_snapshot_reads_every_record_of_the_job(redis_handle: RedisHandle) -> None:
    """Current run, patches, lock holder, incident, watch state, pause, automatic restarts and the
    newest run (with its verification pending) all come back in one read, for several jobs."""
    client, p = redis_handle.client, redis_handle.prefix
    now = time.time()
    runs = RunStore(client, p)
    run = await runs.create("dflash", "U1", action="restart")
    await client.zadd(keys.runs_unverified(p), {run.id: now + 5})
    await client.hset(
        keys.job_current(p, "dflash"),
        mapping={"run_id": run.id, "pid": "4242", "launched_at": repr(now - 100), "state": "running"},
    )
    await client.sadd(keys.job_patches(p, "dflash"), "topk", "fast")
    await client.set(keys.lock(p, "host:gpu1"), "token")
    await client.hset(
        keys.lock_holder(p, "host:gpu1"), mapping={"user": "U2", "job": "eagle", "step": "stop"}
    )
    inc = Incident(n=3, job="dflash", host="gpu1", kind=IncidentKind.DEAD, opened_at=now, notified_at=now)
    await client.hset(keys.incident(p, "dflash"), mapping=inc.to_hash())  # type: ignore[arg-type]
    await client.hset(keys.watch_state(p, "dflash"), mapping={"last_pid": "4242", "log_size": "10"})
    await client.set(keys.watch_off(p, "dflash"), "U3")
    await client.zadd(keys.auto_restarts(p, "dflash"), {"a": now - 60, "b": now - 3600})
    await client.hset(keys.job_current(p, "eagle"), mapping={"state": "stopped", "pid": "7"})

    dflash, eagle = await JobStore(client, p, CONFIG).read_many(["dflash", "eagle"], now=now)
    assert dflash.run_id == run.id and dflash.pid == "4242" and dflash.uptime(now) == 100.0
    assert dflash.patches == ("fast", "topk") and dflash.scope == "job:dflash" and not dflash.lock_held
    assert dflash.incident == inc and dflash.watch.last_pid == 4242 and dflash.watch.log_size == 10
    assert dflash.paused and dflash.auto_restarts == 1
    assert dflash.latest is not None and dflash.latest.id == run.id and dflash.unverified
    assert eagle.scope == "host:gpu1" and eagle.lock_held and eagle.lock_holder["user"] == "U2"
    assert eagle.stopped and eagle.pid == "" and eagle.uptime(now) is None and eagle.latest is None
