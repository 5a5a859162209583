"""Assembly: open Redis and the SSH pool and build the one :class:`~handlers.context.Context` a
process shares, close it all in reverse order.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping

from bot.runtime.settings import from_environ
from bot.text import embedded_redis_started
from handlers.context import Context, Directory
from handlers.outbox import Outbox
from handlers.reply import Reply, Status
from pipeline.config import Config
from pipeline.engines import ENGINES
from pipeline.engines.base import EngineKind, check_engines
from pipeline.engines.runner import Runner
from pipeline.host.remote import SSHPool
from pipeline.pager import open_pager
from pipeline.state.events import Events
from pipeline.state.redisconn import open_redis
from pipeline.state.runs import RunStore

log = logging.getLogger(__name__)

PAGER_DRAIN_S = 10.0  #: seconds a closing process waits for pages still on their way


def new_instance_id() -> str:
    """An id for this process: ``host:pid:random`` (leader lease, claims, logs)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


async def build_context(
    config: Config,
    outbox: Outbox,
    *,
    instance: str | None = None,
    deliver_recovered: bool = False,
    engines: Mapping[str, EngineKind] = ENGINES,
    directory: Directory | None = None,
) -> Context:
    """Open Redis (embedded when ``[redis] url`` is unset) and the SSH pool; build the Context, and
    take over the runs whose owner died (:meth:`pipeline.runs.service.RunService.recover`).

    :param deliver_recovered: also verify the taken-over runs now, and the due ones no live process owns
        (no scheduler: ``pitstop say``).
    :param engines: the engines' registry (:data:`pipeline.engines.ENGINES`).
    :param directory: Slack's user groups, read fresh for approvals (None: a surface without Slack).
    :raises StateUnavailable: if a configured Redis does not answer.
    :raises ConfigError: if a job's engine is not in ``engines`` or its config does not suit it, or
        ``[pager] kind = "pagerduty"`` without ``PAGERDUTY_ROUTING_KEY`` (or ``sync_acks`` without
        ``PAGERDUTY_API_TOKEN``).
    """
    check_engines(config, engines)  # before anything is opened (the Runner checks it again)
    pager = None
    if config.pager is not None:  # before anything is opened: a missing routing key is a config error

        async def refusing(line: str) -> None:
            await outbox.post(Reply(title=line, status=Status.ERROR), config.slack.announce_channel)

        env = from_environ()
        pager = open_pager(
            config.pager, env.pagerduty_routing_key, refusing, api_token=env.pagerduty_api_token
        )
    handle = await open_redis(config)
    if handle.embedded is not None:
        log.info(embedded_redis_started(handle.description))
    instance = instance or new_instance_id()
    ssh = SSHPool(config)
    runs = handle.open_store(RunStore, owner=instance)
    events = handle.open_store(Events)
    restarter = Runner(config, ssh, runs, events, engines=engines)
    ctx = Context(
        config=config,
        redis=handle,
        ssh=ssh,
        runs=runs,
        restarter=restarter,
        events=events,
        outbox=outbox,
        instance=instance,
        directory=directory,
        pager=pager,
    )
    try:
        await ctx.service.recover(deliver=deliver_recovered)
    except Exception:  # recovery must never keep a person from their command
        log.exception("taking over the runs of a dead Pitstop process failed")
    return ctx


async def close_context(ctx: Context) -> None:
    """Send the pages on their way (bounded), hand owned runs over, close the SSH pool, then Redis (the embedded server stops if this
    was its last user)."""
    try:
        if ctx.pager is not None:
            await ctx.pager.drain(PAGER_DRAIN_S)
            await ctx.pager.aclose()
        await ctx.runs.aclose()
        await ctx.ssh.close()
    finally:
        await ctx.redis.aclose()
