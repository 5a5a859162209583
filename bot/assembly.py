"""Assembly: open Redis and the SSH pool from the validated config and build the one
:class:`~handlers.context.Context` a process shares; close it all again in reverse order.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

from handlers.context import Context
from handlers.outbox import Outbox
from handlers.verdicts import recover_runs
from pipeline import messages
from pipeline.config import Config
from pipeline.events import Events
from pipeline.redisconn import open_redis
from pipeline.remote import SSHPool
from pipeline.restart import Restarter
from pipeline.runs import RunStore
from pipeline.slurmengine import SlurmEngine

log = logging.getLogger(__name__)


def new_instance_id() -> str:
    """An id for this process: ``host:pid:random`` (leader lease, claims, logs)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


async def build_context(
    config: Config,
    outbox: Outbox,
    *,
    instance: str | None = None,
    recover: bool = True,
    deliver_recovered: bool = False,
) -> Context:
    """Open Redis (embedded when ``[redis] url`` is unset) and the SSH pool; build the Context.

    Runs this process executes are owned by it (a heartbeat in Redis, see
    :class:`~pipeline.runs.RunStore`).  With ``recover`` (every CLI, console and serve process),
    runs whose owner died are taken over at once (:func:`handlers.verdicts.recover_runs`).

    :param instance: this process's id (default: :func:`new_instance_id`).
    :param recover: take over runs of dead processes before returning.
    :param deliver_recovered: also verify, here and now, the taken-over runs that had launched
        (for processes without a scheduler, such as ``pitstop say``).
    :raises redis.exceptions.ConnectionError: if a configured Redis does not answer.
    """
    handle = await open_redis(config)
    if handle.embedded is not None:
        log.info(messages.embedded_redis_started(handle.description))
    instance = instance or new_instance_id()
    ssh = SSHPool(config)
    runs = RunStore(handle.client, handle.prefix, owner=instance)
    events = Events(handle.client, handle.prefix)
    restarter = Restarter(config, ssh, runs, events)
    SlurmEngine.attach(restarter)
    ctx = Context(
        config=config,
        redis=handle,
        ssh=ssh,
        runs=runs,
        restarter=restarter,
        events=events,
        outbox=outbox,
        instance=instance,
    )
    if recover:
        try:
            await recover_runs(ctx, deliver=deliver_recovered)
        except Exception:  # recovery must never keep a person from their command
            log.exception("taking over the runs of a dead Pitstop process failed")
    return ctx


async def close_context(ctx: Context) -> None:
    """Hand owned runs over, close the SSH pool, then Redis (the embedded server stops if this
    was its last user)."""
    try:
        await ctx.runs.aclose()
        await ctx.ssh.close()
    finally:
        await ctx.redis.aclose()
