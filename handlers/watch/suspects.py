"""Suspect nodes: an incident whose evidence points at one node of a Slurm job makes that node
suspect for ``[watch] suspect_for``; automatic restarts leave suspect nodes out, a person's restart
is told of them.

Evidence, read when the incident opens (:meth:`handlers.watch.cycle.Watcher._with_log`), pure
readers in :mod:`pipeline.observe.suspects`:

- a crash classed ``xid`` (an NVIDIA Xid in the log or the kernel's lines): the failing rank's node,
  else the job's one node;
- ``NODE_FAIL``: the job's Slurm state, or a node of the job Slurm reports down or not responding;
- a stuck rank: its node; a degraded count short on one node: that node;
- a job still running (stuck, degraded): uncorrected ECC errors on a node's GPUs (nvidia-smi on
  every node of the job).

The suspicion is kept in :class:`pipeline.state.nodes.NodeNotes` (the evidence, the job, when, until
when) and told in the alert (``suspect``); ``nodes`` shows it, and it expires by itself.
"""

from __future__ import annotations

import asyncio
import logging

from handlers import text as words
from handlers.context import Context
from pipeline.engines import on_nodes
from pipeline.engines.slurm import SlurmEngine, cluster_of, expected_processes
from pipeline.errors import PitstopError
from pipeline.host.slurm import SlurmJob
from pipeline.observe.suspects import (
    QUERY_ECC_ARGV,
    ecc_words,
    failed_nodes,
    node_of_rank,
    parse_ecc,
    short_node,
    xid,
)
from pipeline.state.incidents import Incident, IncidentKind
from pipeline.state.jobstate import JobRecords
from pipeline.state.nodes import NodeNotes, Suspicion

log = logging.getLogger(__name__)


async def suspect_nodes(ctx: Context, job: str, now: float) -> dict[str, Suspicion]:
    """The suspect nodes of ``job``'s Slurm cluster at ``now`` (unix s), node → why; none for a job
    that is not a Slurm job.  The automatic restart leaves them out (``--exclude``)."""
    cfg = ctx.config.jobs.get(job)
    if cfg is None or not on_nodes(cfg):
        return {}
    return await ctx.redis.open_store(NodeNotes).suspects(cluster_of(ctx.config, job), now)


def excluding(job: str, suspects: dict[str, Suspicion], asked: tuple[str, ...]) -> str | None:
    """The warning a person's restart gets when suspect nodes are not in its ``excluding``: ``n2 is
    suspect (Xid 79 at 10:14): restart dflash excluding n2``; None when there is none."""
    left = {n: s for n, s in sorted(suspects.items()) if n not in asked}
    if not left:
        return None
    return words.suspect_warning(job, {n: (s.why, s.at) for n, s in left.items()}, (*asked, *left))


async def note_suspects(ctx: Context, inc: Incident) -> Incident:
    """Keep the nodes ``inc``'s evidence points at as suspect (until its time + ``[watch]
    suspect_for``) and return the incident with them told (``suspects``); as it is for a job that
    is not a Slurm job, or when nothing points at one node.  A cluster that cannot be asked is
    logged, never raised."""
    cfg = ctx.config.jobs.get(inc.job)
    if cfg is None or not on_nodes(cfg) or inc.kind is IncidentKind.UNREACHABLE:
        return inc
    try:
        clues = await _clues(ctx, inc)
    except PitstopError as exc:
        log.info("watch %s: no suspect nodes: %s", inc.job, exc.message)
        return inc
    if not clues:
        return inc
    at = inc.changed_at or inc.opened_at
    notes, cluster = ctx.redis.open_store(NodeNotes), cluster_of(ctx.config, inc.job)
    until = at + ctx.config.watch.suspect_for
    for node, why in clues.items():
        await notes.suspect(cluster, node, Suspicion(why=why, job=inc.job, at=at, until=until))
    return inc.model_copy(update={"suspects": words.suspects_told(clues, until)})


async def _slurm_job(ctx: Context, job: str) -> SlurmJob | None:
    engine = ctx.restarter.engines["slurm"]
    assert isinstance(engine, SlurmEngine)
    raw = (await ctx.redis.open_store(JobRecords).current(job)).get("slurm_job", "")
    return await engine.client.one(job, int(raw)) if raw.isdigit() else None


async def _clues(ctx: Context, inc: Incident) -> dict[str, str]:
    """Node → the evidence that points at it (the first found per node)."""
    j = await _slurm_job(ctx, inc.job)
    nodelist = j.nodelist if j is not None else ()
    per_node = max(1, expected_processes(ctx.config.jobs[inc.job]) // max(1, len(nodelist)))
    out: dict[str, str] = {}
    if inc.kind is IncidentKind.DEAD:
        if inc.crash_class == "xid":
            rank = inc.crash_rank
            node = node_of_rank(rank, nodelist, per_node) if rank is not None else None
            node = node or (nodelist[0] if len(nodelist) == 1 else None)
            if node is not None:
                out[node] = xid([inc.crash_evidence or ""]) or "Xid"
        engine = ctx.restarter.engines["slurm"]
        assert isinstance(engine, SlurmEngine)
        states = {n.name: n for n in await engine.client.nodes(inc.job)} if j is not None else {}
        down = failed_nodes(nodelist, {n: s.state for n, s in states.items()})
        if j is not None and j.state == "NODE_FAIL" and not down and len(nodelist) == 1:
            down = list(nodelist)
        for node in down:
            found = states.get(node)
            out.setdefault(
                node, words.node_failed(found.state if found else None, found.reason if found else None)
            )
    elif inc.kind is IncidentKind.STUCK_RANK and inc.rank is not None:
        if (node := node_of_rank(inc.rank, nodelist, per_node)) is not None:
            out[node] = words.suspect_stuck(inc.rank, inc.rank_step)
    elif inc.kind is IncidentKind.DEGRADED and (node := short_node(inc.cause)) is not None:
        out[node] = words.suspect_degraded(inc.cause or "")
    if j is not None and j.state == "RUNNING":
        for node, errors in (await _ecc(ctx, inc.job)).items():
            out.setdefault(node, ecc_words(errors))
    return out


async def _ecc(ctx: Context, job: str) -> dict[str, dict[int, int]]:
    """Node → its GPUs' uncorrected ECC errors, for the nodes of the running job that have any."""
    try:
        found = await asyncio.wait_for(
            ctx.restarter.on_job(job, lambda e, t: e.node_outputs(t, QUERY_ECC_ARGV)), 60
        )
    except (PitstopError, TimeoutError) as exc:
        log.info("watch %s: no ECC reading: %s", job, exc)
        return {}
    outputs = found.outputs if found is not None else {}
    return {node: errors for node, text in outputs.items() if (errors := parse_ecc(text))}
