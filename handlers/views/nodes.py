"""Slurm nodes as first-class things: ``nodes [JOB|HOST]``, ``drain NODE REASON [on JOB]``,
``undrain NODE [on JOB]``.

Node verbs run on the clusters of the Slurm jobs Pitstop knows (:func:`pipeline.engines.slurm.clusters`),
through a job's host and ``exec`` prefix (the Slurm engine's client).  A node verb without ``on JOB``
where Pitstop knows several clusters is given its job by :func:`resolve_node` (the dispatcher's
resolve step, before the role, confirmation and two-person checks read the job), from the one cluster
that has the node.  What Pitstop holds against a node (the drains it made) is kept in
:class:`pipeline.state.nodes.NodeNotes`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from handlers import text as words
from handlers.context import Context
from handlers.grammar.commands import Command, ParseError, close_names
from handlers.reply import Reply, Status, Table, refused
from pipeline.engines import on_nodes
from pipeline.engines.slurm import SlurmEngine, cluster_of, clusters
from pipeline.errors import ExitCode, RemoteError
from pipeline.host.slurm import SlurmNode
from pipeline.state.jobstate import JobRecords
from pipeline.state.nodes import NodeNote, NodeNotes, Suspicion


def _engine(ctx: Context) -> SlurmEngine:
    engine = ctx.restarter.engines["slurm"]
    assert isinstance(engine, SlurmEngine)
    return engine


async def _running(ctx: Context, jobs: tuple[str, ...]) -> dict[int, str]:
    """Slurm job id → the Pitstop job it is (each job's recorded ``slurm_job``)."""
    records = ctx.redis.open_store(JobRecords)
    out: dict[int, str] = {}
    for name in jobs:
        raw = (await records.current(name)).get("slurm_job", "")
        if raw.isdigit():
            out[int(raw)] = name
    return out


async def nodes_command(ctx: Context, job: str | None, host: str | None) -> Reply:
    """``nodes [JOB|HOST]``: one table per cluster (a job's, those a login node serves, else every
    one): each node's Slurm state (``MIXED+DRAIN``) and ``sinfo`` state (``drng``), its reason, the
    jobs on it (Pitstop's by name) and what Pitstop holds against it (its drain, why it is suspect).

    :returns: the tables; an error reply (exit 1) when a cluster could not be listed, a refusal
        (exit 2) for a job that is not a Slurm job or a host no Slurm job logs in to.
    """
    known = clusters(ctx.config)
    if job is not None and not on_nodes(ctx.config.jobs[job]):
        return refused(words.nodes_not_slurm(job))
    if not known:
        return refused(words.NODES_NO_SLURM)
    if job is not None:
        wanted = {cluster_of(ctx.config, job): known[cluster_of(ctx.config, job)]}
    else:
        wanted = {
            k: jobs for k, jobs in known.items() if host is None or ctx.config.jobs[jobs[0]].host == host
        }
    if not wanted:
        return refused(words.nodes_no_cluster(host or ""))
    answers = await asyncio.gather(
        *(_engine(ctx).client.nodes(jobs[0]) for jobs in wanted.values()), return_exceptions=True
    )
    notes = ctx.redis.open_store(NodeNotes)
    tables, lines, failed = [], [], False
    for (cluster, jobs), found in zip(wanted.items(), answers, strict=True):
        if isinstance(found, RemoteError):
            lines.append(words.nodes_unavailable(cluster, found.message))
            failed = True
            continue
        if isinstance(found, BaseException):
            raise found
        held, ours = await notes.of(cluster), await _running(ctx, jobs)
        suspect = await notes.suspects(cluster, time.time())
        lines.append(words.nodes_title(cluster, jobs, len(found)))
        rows = tuple(
            (
                n.name,
                n.state,
                n.short,
                n.reason or "-",
                ", ".join(ours.get(j, str(j)) for j in n.jobs) or "-",
                _held(held.get(n.name), suspect.get(n.name)),
            )
            for n in found
        )
        tables.append(Table(words.NODES_HEADERS, rows))
    title, *rest = lines
    return Reply(
        title=title,
        lines=tuple(rest),
        tables=tuple(tables),
        status=Status.ERROR if failed else Status.INFO,
        exit_code=ExitCode.FAILED if failed else ExitCode.OK,
    )


async def resolve_node(ctx: Context, command: Command) -> Command:
    """A node verb with its job: as given, else the first Slurm job of the one cluster that has the
    node (each cluster asked once).

    :raises ParseError: if no cluster has the node (did-you-mean from their nodes) or several do.
    :raises RemoteError: if a cluster cannot be asked.
    """
    if command.node is None or command.job is not None:
        return command
    known = list(clusters(ctx.config).values())
    listed = await asyncio.gather(*(_engine(ctx).client.nodes(jobs[0]) for jobs in known))
    having = [jobs[0] for jobs, nodes in zip(known, listed, strict=True) if command.node in _names(nodes)]
    if len(having) > 1:
        raise ParseError(words.node_ambiguous(command.node, command.verb, having), command.verb)
    if not having:
        every = sorted({n for nodes in listed for n in _names(nodes)})
        where = "any Slurm cluster Pitstop knows"
        raise ParseError(
            words.node_unknown(command.node, where, close_names(command.node, every), every), command.verb
        )
    return dataclasses.replace(command, job=having[0])


def _held(drain: NodeNote | None, suspicion: Suspicion | None) -> str:
    """The ``pitstop`` cell: the drain Pitstop made and why the node is suspect, or ``-``."""
    said = [words.node_held(drain.by, drain.reason, drain.at)] if drain else []
    said += [words.node_suspect(suspicion.why, suspicion.at, suspicion.until)] if suspicion else []
    return "; ".join(said) or "-"


def _names(nodes: list[SlurmNode]) -> list[str]:
    return [n.name for n in nodes]


async def node_command(ctx: Context, command: Command, user: str) -> Reply:
    """``drain NODE REASON`` / ``undrain NODE`` on the cluster of ``command.job``: ``scontrol update
    State=DRAIN Reason=…`` / ``State=RESUME``, the drain kept against the node (:class:`NodeNotes`),
    announced in the channels of the job the verb ran through and of the Pitstop jobs on the node.

    :returns: the node's state afterwards; a refusal (exit 2) for a node the cluster does not have,
        an error (exit 1) when Slurm refused or the cluster could not be reached.
    """
    assert command.job is not None and command.node is not None  # the grammar and resolve_node
    job, node, verb, reason = command.job, command.node, command.verb, command.reason
    client, cluster = _engine(ctx).client, cluster_of(ctx.config, job)
    try:
        before = {n.name: n for n in await client.nodes(job)}
        if node not in before:
            where = f"the cluster of {job}"
            return refused(words.node_unknown(node, where, close_names(node, list(before)), list(before)))
        if verb == "drain":
            await client.drain(job, node, reason or "")
        else:
            await client.resume(job, node)
        after = {n.name: n for n in await client.nodes(job)}.get(node, before[node])
    except RemoteError as exc:
        title = words.node_refused(verb, node, exc.message)
        return Reply(title=title, status=Status.ERROR, exit_code=ExitCode.FAILED)
    notes = ctx.redis.open_store(NodeNotes)
    if verb == "drain":
        await notes.put(cluster, node, NodeNote(by=user, reason=reason or "", at=time.time()))
    else:
        await notes.clear(cluster, node)
    ours = await _running(ctx, clusters(ctx.config)[cluster])
    channels = {ctx.config.channel_for(j) for j in (job, *(ours[i] for i in after.jobs if i in ours))}
    said = Reply(title=words.node_announce(user, verb, node, job, reason), status=Status.WARNING)
    for channel in sorted(c for c in channels if c):
        await ctx.outbox.post(said, channel)
    return Reply(title=words.node_done(verb, node, job, after.state, after.reason), status=Status.OK)
